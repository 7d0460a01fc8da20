//! The pod hook helpers (`wait`, `wait-app-exit`, `drain`, `check`) and the
//! shipped manifests.

use std::net::TcpListener;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::*;

fn helper(name: &'static str, args: &[&str]) -> Proc {
    let mut cmd = Command::new(lifeguard_bin());
    cmd.args(args);
    Proc::spawn(name, cmd, temp_dir(name))
}

#[test]
fn wait_exits_0_once_envoy_and_the_agent_are_ready() {
    let ports = Ports::new();
    let url = format!("http://127.0.0.1:{}/healthz/ready", ports.status_listener.port);
    // Started before anything else: it must keep waiting, then succeed.
    let mut wait = helper(
        "wait",
        &["wait", "--url", &url, "--timeout", "60s", "--period", "100ms"],
    );
    let _agent = Agent::builder().on(&ports).start();
    let _envoy = start_envoy(&bootstrap(&ports));
    let code = wait
        .wait_exit(Duration::from_secs(60))
        .expect("wait returns once ready");
    assert_eq!(code.code(), Some(0), "{}", wait.output());
    assert!(wait.output().contains("is ready after"), "{}", wait.output());
}

#[test]
fn wait_gives_up_after_the_timeout_with_the_last_reason() {
    let nothing = port();
    let url = format!("http://127.0.0.1:{}/healthz/ready", nothing.port);
    let (code, out) = run_lifeguard(&["wait", "--url", &url, "--timeout", "1s", "--period", "100ms"]);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("not ready after 1s") && out.contains("Connection refused"),
        "{out}"
    );
}

#[test]
fn wait_with_timeout_0_keeps_waiting_until_the_url_answers_200() {
    let p = port();
    // The agent's GET /drain answers 200 once the agent runs, Envoy or not.
    let url = format!("http://127.0.0.1:{}/drain", p.port);
    let mut wait = helper("wait", &["wait", "--url", &url, "--timeout", "0", "--period", "100ms"]);
    // Longer than a 1s timeout would have allowed.
    assert!(
        wait.wait_exit(Duration::from_millis(1500)).is_none(),
        "wait gave up: {}",
        wait.output()
    );
    let _agent = Agent::builder()
        .status(p.addr())
        .admin_url("http://127.0.0.1:1")
        .spawn();
    let code = wait
        .wait_exit(Duration::from_secs(10))
        .expect("wait returns once answered");
    assert_eq!(code.code(), Some(0), "{}", wait.output());
}

#[test]
fn drain_client_drains_through_the_agent_and_reports_failures() {
    let nothing = port();
    let (code, out) = run_lifeguard(&[
        "drain",
        "--url",
        &format!("http://127.0.0.1:{}", nothing.port),
        "--timeout",
        "2s",
    ]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("cannot connect"), "{out}");

    let mut pod =
        Pod::start(Agent::builder().args(&["--drain-until", "requests", "--minimum-drain-duration", "200ms"]));
    let ports = &pod.ports;
    let (code, out) = run_lifeguard(&["drain", "--url", &format!("http://127.0.0.1:{}", ports.agent.port)]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("\"phase\":\"drained\""), "{out}");
    assert_eq!(get(ports.agent.addr(), "/healthz/ready").unwrap().0, 503);
    pod.sigterm();
    assert_eq!(pod.agent.exit_code(Duration::from_secs(10)), 0);
}

/// The app of the test below.
const APP_SOCKETS: &str = include_str!("fixtures/app_sockets.py");

/// A listener in its own network namespace (so no other process of this
/// machine is seen) and `wait-app-exit` beside it.
#[test]
fn wait_app_exit_names_the_app_socket_and_ends_when_it_closes() {
    let dir = temp_dir("netns");
    let ready = dir.path().join("ready");
    let close = dir.path().join("close");
    let end = dir.path().join("end");
    let app = dir.path().join("app_sockets.py");
    std::fs::write(&app, APP_SOCKETS).unwrap();
    let script = format!(
        "python3 {app} {ready} {close} {end} & i=0; while [ ! -e {ready} ] && [ $i -lt 1000 ]; do sleep 0.01; i=$((i+1)); done; \
         exec {bin} wait-app-exit --period 100ms --ignore-port 9998",
        app = app.display(),
        ready = ready.display(),
        close = close.display(),
        end = end.display(),
        bin = lifeguard_bin().display(),
    );
    let mut cmd = Command::new("unshare");
    cmd.args(["--net", "sh", "-c", &script]);
    let mut helper = Proc::spawn("wait-app-exit", cmd, temp_dir("wait-app-exit"));
    // The listener outlives the helper's shell; stop it whatever happens.
    struct KillOnDrop<'a>(&'a Path, &'a Path);
    impl Drop for KillOnDrop<'_> {
        fn drop(&mut self) {
            let _ = std::fs::write(self.1, b"");
            if let Some(pid) = std::fs::read_to_string(self.0)
                .ok()
                .and_then(|p| p.trim().parse::<i32>().ok())
            {
                // The listener process this test started.
                common::pod::signal(pid, libc::SIGKILL);
            }
        }
    }
    let _listener = KillOnDrop(&ready, &end);

    let out = wait_for("the helper to name the app's sockets", Duration::from_secs(10), || {
        let out = helper.output();
        if out.contains("127.0.0.1:9999 listening") && out.contains("[::]:9997 listening") {
            Ok(out)
        } else {
            Err(out)
        }
    });
    assert!(!out.contains(":9998"), "an ignored port was counted: {out}");
    assert!(helper.is_running(), "{out}");

    std::fs::write(&close, b"").unwrap();
    let status = helper
        .wait_exit(Duration::from_secs(5))
        .expect("the helper ends once the app stopped listening");
    assert_eq!(status.code(), Some(0), "{}", helper.output());
    assert!(
        helper.output().contains("the app holds no socket"),
        "{}",
        helper.output()
    );
}

#[test]
fn wait_app_exit_gives_up_after_its_timeout_naming_the_socket() {
    // This machine's own namespace: this test's listener (owned by the test
    // process, not a proxy) holds it.
    let socket = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = socket.local_addr().unwrap().port().to_string();
    let (code, out) = run_lifeguard(&["wait-app-exit", "--timeout", "300ms", "--period", "100ms"]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains(&format!("127.0.0.1:{port}")), "{out}");
}

#[test]
fn check_reports_bad_durations_and_drains_that_cannot_fit() {
    let (code, out) = run_lifeguard(&["check", "--termination-drain-duration", "5x"]);
    assert_eq!(code, 2, "{out}");
    assert!(
        out.contains("--termination-drain-duration") && out.contains("5x"),
        "{out}"
    );

    let (code, out) = run_lifeguard(&[
        "check",
        "--termination-grace-period",
        "10s",
        "--termination-drain-duration",
        "20s",
    ]);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("termination_drain_duration (20s)") && out.contains("does not fit"),
        "{out}"
    );

    let dir = temp_dir("check");
    let file = dir.path().join("lifeguard.toml");
    std::fs::write(&file, "poll_interval = \"2s\"\n").unwrap();
    let out = Command::new(lifeguard_bin())
        .args(["check", "--config", file.to_str().unwrap(), "--admin-timeout", "300ms"])
        .env("TERMINATION_GRACE_PERIOD", "45")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{text}");
    let line = |key: &str| text.lines().find(|l| l.starts_with(key)).unwrap_or("").to_owned();
    assert!(
        line("poll_interval ").contains("2s") && line("poll_interval ").contains("(file)"),
        "{text}"
    );
    assert!(
        line("admin_timeout").contains("300ms") && line("admin_timeout").contains("(flag)"),
        "{text}"
    );
    assert!(
        line("termination_grace_period").contains("45s") && line("termination_grace_period").contains("(env)"),
        "{text}"
    );
    assert!(line("status_addr").contains("(default)"), "{text}");
    // The shipped config file is valid and shows every default.
    let (code, out) = run_lifeguard(&[
        "check",
        "--config",
        concat!(env!("CARGO_MANIFEST_DIR"), "/config/lifeguard.toml"),
    ]);
    assert_eq!(code, 0, "{out}");
}

#[test]
#[allow(clippy::too_many_lines)] // one scenario, read top to bottom
fn shipped_manifests_parse_and_keep_their_settings_in_step() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let bootstrap = std::fs::read_to_string(root.join("config/envoy-bootstrap-locked.yaml")).unwrap();
    for (file, native) in [
        ("config/k8s/classic-sidecar.yaml", false),
        ("config/k8s/native-sidecar.yaml", true),
    ] {
        let text = std::fs::read_to_string(root.join(file)).unwrap();
        let docs: Vec<serde_norway::Value> = serde_norway::Deserializer::from_str(&text)
            .map(|d| serde::Deserialize::deserialize(d).unwrap_or_else(|e| panic!("{file}: {e}")))
            .collect();
        let kinds: Vec<_> = docs.iter().map(|d| d["kind"].as_str().unwrap()).collect();
        assert_eq!(kinds, ["ConfigMap", "Deployment", "Service"], "{file}");
        assert_eq!(
            docs[0]["data"]["envoy.yaml"].as_str().unwrap(),
            bootstrap,
            "{file}: the ConfigMap drifted from config/envoy-bootstrap-locked.yaml"
        );

        let pod = &docs[1]["spec"]["template"]["spec"];
        let grace = pod["terminationGracePeriodSeconds"].as_u64().unwrap();
        // app-exit sees the app's processes only in a shared process namespace.
        assert_eq!(pod["shareProcessNamespace"], true, "{file}");
        let proxy = if native {
            &pod["initContainers"][0]
        } else {
            &pod["containers"][0]
        };
        assert_eq!(proxy["name"], "proxy", "{file}");
        let env = proxy["env"].as_sequence().unwrap();
        let grace_env = env.iter().find(|e| e["name"] == "TERMINATION_GRACE_PERIOD").unwrap()["value"]
            .as_str()
            .unwrap();
        assert_eq!(
            grace_env,
            format!("{grace}s"),
            "{file}: TERMINATION_GRACE_PERIOD out of step"
        );
        let command: Vec<_> = proxy["command"]
            .as_sequence()
            .unwrap()
            .iter()
            .map(|c| c.as_str().unwrap())
            .collect();
        assert_eq!(&command[..3], ["lifeguard", "run", "--"], "{file}");
        for probe in ["readinessProbe", "startupProbe"] {
            assert_eq!(proxy[probe]["httpGet"]["port"].as_u64(), Some(15021), "{file} {probe}");
            assert_eq!(proxy[probe]["httpGet"]["path"], "/healthz/ready", "{file} {probe}");
        }
        let hooks = &proxy["lifecycle"];
        if native {
            assert_eq!(proxy["restartPolicy"], "Always");
            assert_eq!(hooks["preStop"]["exec"]["command"][1], "drain", "{file}");
        } else {
            assert_eq!(hooks["postStart"]["exec"]["command"][1], "wait", "{file}");
            // SIGTERM reaches lifeguard and the app together; app-exit needs
            // no hook to hold the proxy.
            assert!(hooks["preStop"].is_null(), "{file}: the proxy has a preStop hook");
        }
        // The settings the pod passes are valid for `lifeguard check`.
        let mut cmd = Command::new(lifeguard_bin());
        cmd.arg("check");
        for e in env {
            cmd.env(e["name"].as_str().unwrap(), e["value"].as_str().unwrap());
        }
        let out = cmd.output().unwrap();
        assert_eq!(
            out.status.code(),
            Some(0),
            "{file}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let settings = String::from_utf8_lossy(&out.stdout);
        let setting = |key: &str| {
            let prefix = format!("{key} ");
            settings
                .lines()
                .find(|l| l.starts_with(&prefix))
                .unwrap_or("")
                .to_owned()
        };
        assert!(setting("drain_until").contains("app-exit"), "{file}: {settings}");
        // The locked form: admin and control on sockets of a directory only
        // the proxy container mounts; no drain or stop from loopback.
        let run = "/var/run/lifeguard";
        assert!(
            setting("admin_url").contains(&format!("unix://{run}/admin.sock")),
            "{file}: {settings}"
        );
        assert!(
            setting("control_socket").contains(&format!("{run}/control.sock")),
            "{file}: {settings}"
        );
        assert!(setting("loopback_control").contains("false"), "{file}: {settings}");
        let mounts = |c: &serde_norway::Value| -> Vec<String> {
            let mounts = c["volumeMounts"].as_sequence().cloned().unwrap_or_default();
            mounts
                .iter()
                .map(|m| m["mountPath"].as_str().unwrap().to_owned())
                .collect()
        };
        assert!(
            mounts(proxy).iter().any(|m| m == run),
            "{file}: the proxy does not mount {run}"
        );
        for app in pod["containers"]
            .as_sequence()
            .unwrap()
            .iter()
            .filter(|c| c["name"] != "proxy")
        {
            assert!(
                !mounts(app).iter().any(|m| m == run),
                "{file}: {:?} mounts {run}",
                app["name"]
            );
            // The app stops once the pod is out of its load balancers'
            // rotation: its preStop hook is the drain wait, on 15020.
            let hook = &app["lifecycle"]["preStop"]["httpGet"];
            assert_eq!(hook["path"], "/drain/wait", "{file}: {:?}", app["name"]);
            assert_eq!(hook["port"].as_u64(), Some(15020), "{file}: {:?}", app["name"]);
        }
        let volumes = pod["volumes"].as_sequence().unwrap();
        let volume = volumes
            .iter()
            .find(|v| v["name"] == "lifeguard-run")
            .expect("the sockets' volume");
        assert!(volume["emptyDir"].is_mapping(), "{file}: {volume:?}");
    }
    // And Envoy accepts every bootstrap.
    for file in [
        "config/envoy-bootstrap.yaml",
        "config/envoy-bootstrap-locked.yaml",
        "config/envoy-gateway.yaml",
    ] {
        let out = Command::new(envoy_bin())
            .args(["--mode", "validate", "-c"])
            .arg(root.join(file))
            .output()
            .unwrap();
        assert!(out.status.success(), "{file}: {}", String::from_utf8_lossy(&out.stderr));
    }
}
