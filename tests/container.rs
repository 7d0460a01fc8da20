//! The image that ships, and the shipped manifest played by a
//! real container engine.
//!
//! The lifeguard-envoy image is built by `scripts/image --local-base` from
//! the top-level Containerfile, on a base laid out as the distroless Envoy
//! image from the Envoy binary the suite runs (no registry is reachable
//! here). `config/k8s/classic-sidecar.yaml` is played with `podman kube
//! play`, with only the images replaced and what podman cannot take adapted
//! (`common/container.rs` explains each adaptation), and terminated as the
//! kubelet terminates a classic sidecar's pod: every container stopped at
//! one instant (its preStop hook, then its SIGTERM), SIGKILL at the grace
//! period.
//!
//! What a user would check: the image's labels, user and binaries; the pod
//! ready through 15021; requests served through Envoy; the app, in its own
//! container, locked out of Envoy's admin and lifeguard's control; and at
//! termination nothing lost, lifeguard's exit 0 and its summary in the log
//! and in the termination message. Needs root (podman, namespaces).

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::Value as Json;
use serde_norway::Value;

use common::{children, container, http_timeout, pod, temp_dir, unique, TempDir};
use container::{images, kube_pod, kubelet_probe, podman, podman_ok, PlayedPod, PreStop};
use pod::{ns_pid, peer_service, with_outbound};

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// A container of this test's, removed on drop (SIGKILLed at once).
struct Container(String);

impl Drop for Container {
    fn drop(&mut self) {
        let _ = podman(&["rm", "--force", "--time", "0", &self.0]);
    }
}

fn label(image: &str, key: &str) -> String {
    let format = format!("{{{{index .Labels \"{key}\"}}}}");
    podman_ok(&["image", "inspect", "--format", &format, image])
        .trim()
        .to_owned()
}

#[test]
#[allow(clippy::too_many_lines)] // one scenario, read top to bottom
fn the_image_builds_from_the_containerfile_with_its_binary_the_bootstraps_and_its_labels() {
    let images = images();
    eprintln!(
        "scripts/image --local-base: {:.1} s (Envoy {})",
        images.build_time.as_secs_f64(),
        images.envoy_version
    );
    assert!(
        images.build_log.contains("STEP 1/") && images.build_log.contains("FROM "),
        "{}",
        images.build_log
    );
    let proxy = &images.proxy;
    assert_eq!(
        label(proxy, "org.opencontainers.image.version"),
        env!("CARGO_PKG_VERSION")
    );
    assert_eq!(label(proxy, "org.opencontainers.image.licenses"), "Apache-2.0");
    assert_eq!(label(proxy, "org.opencontainers.image.title"), "lifeguard-envoy");
    assert_eq!(label(proxy, "org.opencontainers.image.base.name"), images.base);
    let head = std::process::Command::new("git")
        .args(["rev-parse", "HEAD"])
        .current_dir(root())
        .output()
        .unwrap();
    let head = String::from_utf8_lossy(&head.stdout).trim().to_owned();
    let revision = label(proxy, "org.opencontainers.image.revision");
    assert!(
        !head.is_empty() && revision.starts_with(&head),
        "revision {revision:?}, HEAD {head:?}"
    );
    let config = podman_ok(&[
        "image",
        "inspect",
        "--format",
        "{{.Config.User}}|{{json .Config.Entrypoint}}|{{json .Config.Cmd}}",
        proxy,
    ]);
    assert_eq!(
        config.trim(),
        r#"65532:65532|["/usr/local/bin/lifeguard"]|["run","--","envoy","-c","/etc/envoy/envoy.yaml","--disable-hot-restart"]"#
    );

    // Its files, read from the image's own file system.
    let mounted = podman_ok(&["image", "mount", proxy]).trim().to_owned();
    let files = Path::new(&mounted);
    struct Unmount<'a>(&'a str);
    impl Drop for Unmount<'_> {
        fn drop(&mut self) {
            let _ = podman(&["image", "unmount", self.0]);
        }
    }
    let _unmount = Unmount(proxy);
    for (inside, shipped) in [
        ("etc/envoy/envoy.yaml", "config/envoy-bootstrap.yaml"),
        ("etc/envoy/envoy-locked.yaml", "config/envoy-bootstrap-locked.yaml"),
        ("etc/envoy/gateway.yaml", "config/envoy-gateway.yaml"),
    ] {
        assert_eq!(
            std::fs::read_to_string(files.join(inside)).unwrap(),
            std::fs::read_to_string(root().join(shipped)).unwrap(),
            "/{inside}"
        );
    }
    // lifeguard byte for byte as it was given (the release's dist/lifeguard,
    // or scripts/test's own build: see `images`), static (the base has no
    // C library but glibc's), and no .debug file anywhere; the release's
    // with no debug info inside.
    let binary = std::fs::read(files.join("usr/local/bin/lifeguard")).unwrap();
    assert!(
        binary == std::fs::read(&images.binary).unwrap(),
        "the image's lifeguard is not {}",
        images.binary.display()
    );
    let sections = std::process::Command::new("readelf")
        .args(["-S", "-l", "-W"])
        .arg(files.join("usr/local/bin/lifeguard"))
        .output()
        .unwrap();
    let sections = String::from_utf8_lossy(&sections.stdout);
    assert!(
        !sections.contains("INTERP"),
        "the image's lifeguard is not static:\n{sections}"
    );
    if images.release {
        assert!(!sections.contains(".debug_info"), "debug info in the shipped binary");
    }
    let find = std::process::Command::new("find")
        .arg(files)
        .args(["-xdev", "-name", "*.debug"])
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&find.stdout), "", "a .debug file in the image");
    assert!(files.join("usr/local/bin/envoy").is_file());
}

#[test]
fn the_image_runs_as_non_root_and_its_lifeguard_is_this_crate() {
    let images = images();
    let version = podman_ok(&["run", "--rm", "--network", "none", &images.proxy, "--version"]);
    assert_eq!(version.trim(), format!("lifeguard {}", env!("CARGO_PKG_VERSION")));

    // lifeguard taken into another image with `COPY --from=` (README,
    // Deploy): it needs nothing of the image, not even a C library.
    let (pid, n) = unique();
    let scratch = format!("localhost/lifeguard-test-scratch-{pid}-{n}:1");
    container::remove_at_exit(&scratch);
    let dir = temp_dir("scratch-image");
    let containerfile = format!(
        "FROM scratch\nCOPY --from={} /usr/local/bin/lifeguard /lifeguard\nENTRYPOINT [\"/lifeguard\"]\n",
        images.proxy
    );
    std::fs::write(dir.path().join("Containerfile"), containerfile).unwrap();
    podman_ok(&["build", "--quiet", "-t", &scratch, &dir.path().display().to_string()]);
    let alone = podman_ok(&["run", "--rm", "--network", "none", &scratch, "--version"]);
    assert_eq!(alone, version);

    // The image's own command: lifeguard running Envoy on the plain
    // bootstrap, in a network namespace of its own.
    let name = format!("lifeguard-test-{pid}-{n}-run");
    let container = Container(name.clone());
    podman_ok(&[
        "run",
        "--detach",
        "--network",
        "none",
        "--name",
        &container.0,
        &images.proxy,
    ]);
    let (code, out) = {
        let out = podman(&["exec", &name, "lifeguard", "wait", "--timeout", "30s"]);
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (out.status.code().unwrap_or(-1), text)
    };
    let logs = || {
        let out = podman(&["logs", &name]);
        String::from_utf8_lossy(&out.stderr).into_owned() + &String::from_utf8_lossy(&out.stdout)
    };
    assert_eq!(code, 0, "lifeguard wait in the container: {out}\n{}", logs());
    let lifeguard = container::container_pid(&name);
    let envoy = match children(lifeguard).as_slice() {
        [envoy] => *envoy,
        other => panic!("lifeguard's children: {other:?}"),
    };
    for (what, pid) in [("lifeguard", lifeguard), ("envoy", envoy)] {
        let status = procfs::process::Process::new(pid).unwrap().status().unwrap();
        assert_eq!(status.name, what);
        assert_eq!(
            (status.ruid, status.euid, status.rgid, status.egid),
            (65532, 65532, 65532, 65532),
            "{what} runs as {}:{}",
            status.euid,
            status.egid
        );
    }
    // The version of the Envoy it runs, in its log.
    let want = format!("version={}", images.envoy_version);
    common::wait_for("Envoy's version in the log", Duration::from_secs(10), || {
        let out = logs();
        match out.lines().find(|l| l.contains("Envoy version")) {
            Some(line) if line.contains(&want) => Ok(()),
            _ => Err(out),
        }
    });
}

/// The manifest's documents.
fn manifest(path: &str) -> Vec<Value> {
    let text = std::fs::read_to_string(root().join(path)).unwrap();
    serde_norway::Deserializer::from_str(&text)
        .map(|d| serde::Deserialize::deserialize(d).unwrap())
        .collect()
}

/// The named container of a Deployment in `docs`.
fn container_of<'a>(docs: &'a mut [Value], name: &str) -> &'a mut Value {
    let deployment = docs
        .iter_mut()
        .find(|d| d["kind"] == "Deployment")
        .expect("a Deployment");
    deployment["spec"]["template"]["spec"]["containers"]
        .as_sequence_mut()
        .unwrap()
        .iter_mut()
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("no container {name}"))
}

fn env_of(container: &Value, key: &str) -> String {
    container["env"]
        .as_sequence()
        .unwrap()
        .iter()
        .find(|e| e["name"] == key)
        .and_then(|e| e["value"].as_str())
        .unwrap_or_else(|| panic!("no {key} in the container's env"))
        .to_owned()
}

/// The Prometheus of the pod (its annotations point at 15020
/// `/stats/prometheus`): a scrape every second from outside the pod, until
/// the agent stops answering. The proxy lingers after Envoy stops until a
/// scrape has seen the final state (`LIFEGUARD_LINGER`), as it would for
/// this Prometheus.
fn prometheus(pod: &PlayedPod) -> std::thread::JoinHandle<usize> {
    let addr = pod.net.pod_addr(15020);
    pod.net.peer.spawn(move || {
        let mut answered = 0;
        let mut failed = 0;
        while failed < 2 {
            match http_timeout("GET", addr, "/stats/prometheus", Duration::from_secs(5)) {
                Ok((200, _)) => {
                    answered += 1;
                    failed = 0;
                }
                _ => failed += 1,
            }
            std::thread::sleep(Duration::from_secs(1));
        }
        answered
    })
}

#[test]
#[allow(clippy::too_many_lines)] // one scenario, read top to bottom
fn the_classic_sidecar_manifest_played_by_podman_terminates_with_nothing_lost() {
    let images = images();
    let (pid, n) = unique();
    let name = format!("lifeguard-test-{pid}-{n}");
    let dir: TempDir = temp_dir("kube");
    let mut docs = manifest("config/k8s/classic-sidecar.yaml");

    // The two images replaced.
    container_of(&mut docs, "proxy")["image"] = Value::from(images.proxy.as_str());
    container_of(&mut docs, "app")["image"] = Value::from(images.app.as_str());
    // The test's one addition (not podman's): the app calls a peer service
    // through Envoy while it shuts down, and the shipped bootstrap has no
    // outbound listener (a mesh's come from its control plane). The
    // ConfigMap's bootstrap gets one on 127.0.0.1:15001, to the peer.
    let addresses = common::netns::Net::addresses();
    let config = docs.iter_mut().find(|d| d["kind"] == "ConfigMap").unwrap();
    let bootstrap = config["data"]["envoy.yaml"].as_str().unwrap().to_owned();
    config["data"]["envoy.yaml"] = Value::from(with_outbound(&bootstrap, addresses.1, false));

    let proxy = container_of(&mut docs, "proxy").clone();
    let grace = Duration::from_secs(
        docs.iter().find(|d| d["kind"] == "Deployment").unwrap()["spec"]["template"]["spec"]
            ["terminationGracePeriodSeconds"]
            .as_u64()
            .unwrap(),
    );
    let post_start: Vec<String> = proxy["lifecycle"]["postStart"]["exec"]["command"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap().to_owned())
        .collect();
    let admin_socket = env_of(&proxy, "LIFEGUARD_ADMIN_URL")
        .strip_prefix("unix://")
        .unwrap()
        .to_owned();
    let control_socket = env_of(&proxy, "LIFEGUARD_CONTROL_SOCKET");
    let pre_stops: Vec<(&str, PreStop)> = ["proxy", "app"]
        .into_iter()
        .map(|c| (c, PreStop::of(container_of(&mut docs, c))))
        .collect();

    // What podman cannot take, adapted (see common/container.rs).
    let message = dir.path().join("proxy-termination-log");
    std::fs::write(&message, "").unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&message, std::fs::Permissions::from_mode(0o666)).unwrap();
    let played = kube_pod(&docs, &name, &[("proxy", &message)]);
    let pod = PlayedPod::play(&name, &played, addresses, dir);
    let _peer = peer_service(&pod.net);
    let started = Instant::now();

    // The kubelet's startup probe: Envoy's 15021, from outside the pod.
    let status = pod.net.pod_addr(15021);
    pod.net
        .peer
        .run(move || kubelet_probe(status, "/healthz/ready", Duration::from_secs(60)));
    eprintln!(
        "ready through 15021 {} ms after the play",
        started.elapsed().as_millis()
    );
    // The postStart hook, run in the proxy's container as the kubelet would.
    let argv: Vec<&str> = post_start.iter().map(String::as_str).collect();
    let (code, out) = pod.exec("proxy", &argv);
    assert_eq!(code, 0, "postStart {post_start:?}: {out}");
    pod.wait_logs("app", "ready", Duration::from_secs(30));

    // lifeguard sees the app's processes (shareProcessNamespace) and says
    // which Envoy it runs.
    let logs = pod.logs("proxy");
    let line = |message: &str| -> Json {
        logs.lines()
            .filter_map(|l| serde_json::from_str::<Json>(l).ok())
            .find(|j| j["fields"]["message"].as_str().is_some_and(|m| m.starts_with(message)))
            .unwrap_or_else(|| panic!("no {message:?} line in the proxy's log:\n{logs}"))
    };
    assert_eq!(
        line("app-exit: waiting for the app's sockets")["fields"]["processes"],
        true
    );
    let version = line("Envoy version");
    assert_eq!(version["fields"]["version"], images.envoy_version.as_str(), "{version}");

    // Requests through Envoy's inbound listener, from outside the pod.
    let inbound = pod.net.pod_addr(15006);
    let answer = pod
        .net
        .peer
        .run(move || http_timeout("GET", inbound, "/work/0", Duration::from_secs(5)));
    assert_eq!(answer.unwrap(), (200, "done\n".to_owned()));
    // From here to the deletion, five requests a second (below).
    let steady_since = Instant::now();
    let (steady, sent) = (
        Arc::new(AtomicBool::new(true)),
        Arc::new(std::sync::atomic::AtomicUsize::new(0)),
    );
    let trickle = {
        let (steady, sent) = (steady.clone(), sent.clone());
        pod.net.peer.spawn(move || {
            let mut failed = 0;
            while steady.load(Ordering::Relaxed) {
                let answer = http_timeout("GET", inbound, "/work/0", Duration::from_secs(5));
                failed += usize::from(!matches!(answer, Ok((200, _))));
                sent.fetch_add(1, Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(200));
            }
            failed
        })
    };

    // The app, in its own container (root there, with the runtime's
    // default capabilities), reaches neither socket: not at their paths
    // (the emptyDir is mounted in the proxy's container only), nor through
    // the proxy's processes in the shared PID namespace; and 15020's POST
    // routes answer it 403.
    let app_pid = pod.pid("app");
    let lifeguard_pid = pod.pid("proxy");
    let envoy_pid = match children(lifeguard_pid).as_slice() {
        [envoy] => *envoy,
        other => panic!("lifeguard's children: {other:?}"),
    };
    let through = |pid: i32, path: &str| format!("/proc/{}/root{path}", ns_pid(pid));
    for (admin, control, expect) in [
        (admin_socket.clone(), control_socket.clone(), "missing"),
        (
            through(envoy_pid, &admin_socket),
            through(lifeguard_pid, &control_socket),
            "denied",
        ),
    ] {
        let (code, out) = pod.exec(
            "app",
            &["/usr/bin/python3", "-I", "/app/app_reach.py", &admin, &control],
        );
        assert_eq!(code, 0, "{out}");
        eprintln!("what the app reached ({admin}, {control}):\n{out}");
        for want in [
            "admin-tcp-quit refused".to_owned(),
            "admin-tcp-config-dump refused".to_owned(),
            format!("admin-unix-quit {expect}"),
            format!("admin-unix-drain {expect}"),
            format!("control-unix-quit {expect}"),
            "agent-drain open 403".to_owned(),
            "agent-drain-nowait open 403".to_owned(),
            "agent-quit open 403".to_owned(),
            "agent-drain-status open 200".to_owned(),
        ] {
            assert!(out.lines().any(|l| l == want), "missing {want:?} in:\n{out}");
        }
    }
    // Why the app must run as another user than the proxy's (docs/deploy.md,
    // the manifests): a process of the proxy's user in the app's container does
    // reach the admin socket through the shared PID namespace. It only
    // connects: no request is sent.
    let admin_through = through(envoy_pid, &admin_socket);
    let connect =
        format!("import socket; s = socket.socket(socket.AF_UNIX); s.connect({admin_through:?}); print('connected')");
    let proxy_user = podman_ok(&["image", "inspect", "--format", "{{.Config.User}}", &images.proxy]);
    let same_user = podman(&[
        "exec",
        "--user",
        proxy_user.trim(),
        &pod.container("app"),
        "/usr/bin/python3",
        "-I",
        "-c",
        &connect,
    ]);
    assert_eq!(
        String::from_utf8_lossy(&same_user.stdout).trim(),
        "connected",
        "{}",
        String::from_utf8_lossy(&same_user.stderr)
    );
    assert_ne!(app_pid, lifeguard_pid);
    // Nothing of that drained or stopped anything: the kubelet's readiness
    // probe.
    pod.net
        .peer
        .run(move || kubelet_probe(status, "/healthz/ready", Duration::from_secs(5)));

    // The pod's traffic before its deletion: five requests a second from
    // the first (above) to the deletion, for 25 s at least, so that the
    // drain wait's quiet period is seconds. The rate is taken over the
    // 10 s stretches between its samples but the busiest: a burst of 40
    // requests alone, or steady traffic through a single stretch after
    // one with a stray request, made it 0.10 a second on a busy machine,
    // and the quiet period the wait's bound (docs/drain.md, what a quiet
    // pod's drain costs). 25 s spans two whole stretches.
    common::wait_for("25 s of steady traffic", Duration::from_secs(60), || {
        match (sent.load(Ordering::Relaxed), steady_since.elapsed()) {
            (n, took) if n >= 40 && took >= Duration::from_secs(25) => Ok(()),
            other => Err(other),
        }
    });
    // A request in flight, Prometheus scraping, then the pod deleted (the
    // steady traffic stopped at once, as a load balancer that lets the pod
    // go): the proxy's SIGTERM at once (it has no preStop hook), the app's
    // once its preStop hook (the drain wait) has answered.
    let request = pod.net.peer.spawn(move || {
        let r = http_timeout("GET", inbound, "/work/3", Duration::from_secs(20));
        (r, Instant::now())
    });
    pod.wait_logs("app", "inbound /work/3", Duration::from_secs(10));
    let scrapes = prometheus(&pod);
    steady.store(false, Ordering::Relaxed);
    let failed = trickle.join().unwrap();
    assert_eq!(failed, 0, "requests of the steady traffic not answered 200");
    let (t0, stopping) = pod.delete(&pre_stops, grace);
    let deadline = t0 + grace;

    let (answer, answered_at) = request.join().unwrap();
    assert_eq!(answer.unwrap(), (200, "done\n".to_owned()), "the request in flight");
    let app_exit = pod.wait_exit("app", deadline);
    let app_exited = t0.elapsed();
    let proxy_exit = pod.wait_exit("proxy", deadline);
    let proxy_exited = t0.elapsed();
    if proxy_exit.is_none() || app_exit.is_none() {
        // The kubelet at the end of the grace period.
        pod.sigkill(&["proxy", "app"]);
        panic!("the pod outlived its grace period ({grace:?}): app {app_exit:?}, proxy {proxy_exit:?}");
    }
    let scrapes = scrapes.join().unwrap();
    let stopped: Vec<_> = stopping.into_iter().map(|s| s.join().unwrap()).collect();
    let sigterm_at = |i: usize| stopped[i].1.duration_since(t0).as_millis();
    eprintln!(
        "deleted -> proxy's SIGTERM {} ms, app's {} ms (its preStop hook answered: {:?}); request answered {} ms, \
         app exited {} ms, proxy exited {} ms; {scrapes} scrapes",
        sigterm_at(0),
        sigterm_at(1),
        stopped[1].0,
        answered_at.duration_since(t0).as_millis(),
        app_exited.as_millis(),
        proxy_exited.as_millis()
    );
    // The app's hook, when the manifest has one, is the drain wait: out of
    // rotation once no new request came for its quiet period, no load
    // balancer having checked the pod (the kubelet's probes are not one).
    if let (_, PreStop::HttpGet { .. }) = &pre_stops[1] {
        let (code, line) = stopped[1].0.as_ref().unwrap().as_ref().unwrap();
        assert_eq!(*code, 200, "{line}");
        assert!(
            line.starts_with("out of rotation: no load balancer was seen checking the pod"),
            "{line}\nthe proxy's log:\n{}",
            pod.logs("proxy")
        );
    }

    // The app finished its request and every outbound call it made while
    // shutting down was answered (it exits 1 otherwise).
    let app_logs = pod.logs("app");
    let calls = app_logs
        .lines()
        .find(|l| l.starts_with("calls "))
        .unwrap_or_else(|| panic!("the app did not report its calls:\n{app_logs}"));
    assert!(
        calls.ends_with(" ok 0 failed") && !calls.starts_with("calls 0 "),
        "{calls}"
    );
    assert_eq!(app_exit, Some(0), "{app_logs}");

    // lifeguard exited 0; its summary is its last log line and the
    // termination message.
    assert_eq!(proxy_exit, Some(0));
    let logs = pod.logs("proxy");
    let summary: Json = logs
        .lines()
        .filter_map(|l| serde_json::from_str::<Json>(l).ok())
        .find(|j| j["fields"]["message"] == "lifeguard exiting")
        .unwrap_or_else(|| panic!("no summary in the proxy's log:\n{logs}"));
    let fields = &summary["fields"];
    assert_eq!(
        (
            &fields["outcome"],
            &fields["exit_code"],
            &fields["trigger"],
            &fields["policy"]
        ),
        (
            &Json::from("drained"),
            &Json::from(0),
            &Json::from("SIGTERM"),
            &Json::from("app-exit")
        ),
        "{summary}"
    );
    let message = std::fs::read_to_string(&message).unwrap();
    let written: Json = serde_json::from_str(&message).unwrap_or_else(|e| panic!("{e}: {message:?}"));
    assert_eq!(
        (&written["outcome"], &written["exit_code"], &written["trigger"]),
        (&Json::from("drained"), &Json::from(0), &Json::from("SIGTERM")),
        "{message}"
    );
    assert_eq!(written["cut_by_deadline"], false);
}

/// The ingress gateway's kustomize base (`config/k8s/gateway/base`, what
/// every overlay shares) played by podman, deleted with a request in flight. Its only container is the proxy; its upstream lives
/// outside the pod (a service in the peer namespace, slow to answer
/// `/slow`). At the deletion (SIGTERM, no preStop hook) readiness turns
/// 503 and Envoy keeps serving: no load balancer checks this pod (the
/// kubelet's probes are not one) and no new request comes, so it is out of
/// rotation after the quiet period; Envoy then closes its connections and
/// stops once the request in flight is answered.
#[test]
#[allow(clippy::too_many_lines)] // one scenario, read top to bottom
fn the_ingress_gateway_manifest_played_by_podman_answers_the_request_in_flight() {
    let images = images();
    let (pid, n) = unique();
    let name = format!("lifeguard-test-{pid}-{n}");
    let dir: TempDir = temp_dir("kube");
    // Rendered as an operator renders it; the pod's documents kept (podman
    // plays a pod and its ConfigMaps).
    let mut docs: Vec<Value> = common::kustomize(&common::root().join("config/k8s/gateway/base"))
        .into_iter()
        .filter(|d| d["kind"] == "ConfigMap" || d["kind"] == "Deployment")
        .collect();
    container_of(&mut docs, "proxy")["image"] = Value::from(images.proxy.as_str());
    // The backend: the peer service, outside the pod (the test's one
    // change to the bootstrap, as a user points it at theirs).
    let addresses = common::netns::Net::addresses();
    let config = docs.iter_mut().find(|d| d["kind"] == "ConfigMap").unwrap();
    let bootstrap = config["data"]["envoy.yaml"].as_str().unwrap().to_owned();
    let backend = "socket_address: { address: backend.default.svc.cluster.local, port_value: 80 }";
    assert!(bootstrap.contains(backend));
    let pointed = bootstrap
        .replace(
            backend,
            &format!("socket_address: {{ address: {}, port_value: 8080 }}", addresses.1),
        )
        .replace("type: STRICT_DNS", "type: STATIC");
    config["data"]["envoy.yaml"] = Value::from(pointed);
    let proxy = container_of(&mut docs, "proxy").clone();
    let grace = Duration::from_secs(
        docs.iter().find(|d| d["kind"] == "Deployment").unwrap()["spec"]["template"]["spec"]
            ["terminationGracePeriodSeconds"]
            .as_u64()
            .unwrap(),
    );
    assert!(proxy["lifecycle"].is_null(), "the gateway's proxy has no hook");

    let message = dir.path().join("proxy-termination-log");
    std::fs::write(&message, "").unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&message, std::fs::Permissions::from_mode(0o666)).unwrap();
    let played = kube_pod(&docs, &name, &[("proxy", &message)]);
    let pod = PlayedPod::play(&name, &played, addresses, dir);
    let upstream = {
        let addr = std::net::SocketAddr::from((pod.net.peer_ip, 8080));
        let listener = pod.net.peer.run(move || std::net::TcpListener::bind(addr).unwrap());
        common::TestServer::serve(listener, |req| async move {
            if req.uri().path() == "/slow" {
                tokio::time::sleep(Duration::from_secs(3)).await;
            }
            common::reply(200, "backend\n")
        })
    };
    let status = pod.net.pod_addr(15021);
    pod.net
        .peer
        .run(move || kubelet_probe(status, "/healthz/ready", Duration::from_secs(60)));
    let traffic = pod.net.pod_addr(8080);
    let answer = pod
        .net
        .peer
        .run(move || http_timeout("GET", traffic, "/", Duration::from_secs(5)));
    assert_eq!(answer.unwrap(), (200, "backend\n".to_owned()));

    // A request in flight, then the pod deleted.
    let request = pod.net.peer.spawn(move || {
        let r = http_timeout("GET", traffic, "/slow", Duration::from_secs(20));
        (r, Instant::now())
    });
    common::wait_for("the request to reach Envoy", Duration::from_secs(10), || {
        let stats = pod.net.pod.run(|| {
            common::get(
                std::net::SocketAddr::from(([127, 0, 0, 1], 15000)),
                "/stats?filter=gateway_http.downstream_rq_active",
            )
        });
        match stats {
            Ok((200, body)) if body.contains("downstream_rq_active: 1") => Ok(()),
            other => Err(format!("{other:?}")),
        }
    });
    let (t0, stopping) = pod.delete(&[("proxy", PreStop::None)], grace);
    let (answer, answered_at) = request.join().unwrap();
    assert_eq!(answer.unwrap(), (200, "backend\n".to_owned()), "the request in flight");
    let exit = pod.wait_exit("proxy", t0 + grace);
    let exited = t0.elapsed();
    if exit.is_none() {
        pod.sigkill(&["proxy"]);
        panic!("the gateway outlived its grace period ({grace:?})");
    }
    drop(stopping);
    drop(upstream);
    eprintln!(
        "deleted -> request answered {} ms, proxy exited {} ms",
        answered_at.duration_since(t0).as_millis(),
        exited.as_millis()
    );
    assert_eq!(exit, Some(0), "{}", pod.logs("proxy"));
    let message = std::fs::read_to_string(&message).unwrap();
    let written: Json = serde_json::from_str(&message).unwrap_or_else(|e| panic!("{e}: {message:?}"));
    assert_eq!(
        (&written["outcome"], &written["policy"], &written["exit_code"]),
        (&Json::from("drained"), &Json::from("out-of-rotation"), &Json::from(0)),
        "{message}"
    );
    let lbs = &written["load_balancers"];
    assert_eq!(lbs["out_of_rotation"], true, "{message}");
    assert_eq!(written["cut_by_deadline"], false, "{message}");
}
