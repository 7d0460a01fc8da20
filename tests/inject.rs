//! `lifeguard inject`, the real binary: the shipped example rewritten as
//! checked in, idempotence, stdin, several documents, errors, and the
//! result read back by the agent.

use std::path::PathBuf;

use common::*;
use lifeguard::istio::probers::{AppProbes, Port};
use serde_norway::Value;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// `lifeguard inject ARGS` with `stdin`; (exit code, stdout, stderr).
fn inject(args: &[&str], stdin: &str) -> (i32, String, String) {
    let mut all = vec!["inject"];
    all.extend_from_slice(args);
    run_with_stdin(&lifeguard_bin(), &all, stdin)
}

#[test]
fn the_shipped_example_is_what_inject_makes_of_it_and_a_second_run_changes_nothing() {
    let source = root().join("config/k8s/app-probes.yaml");
    let shipped = std::fs::read_to_string(root().join("config/k8s/app-probes.injected.yaml")).unwrap();
    let (code, out, err) = inject(&[source.to_str().unwrap()], "");
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        out, shipped,
        "config/k8s/app-probes.injected.yaml is stale: regenerate it with `lifeguard inject config/k8s/app-probes.yaml`"
    );
    let (code, again, _) = inject(&[], &out);
    assert_eq!(code, 0);
    assert_eq!(again, out, "idempotent, through stdin");
    for path in [
        "/app-health/greeter/readyz",
        "/app-health/greeter/livez",
        "/app-health/greeter/startupz",
        "/app-lifecycle/greeter/prestopz",
    ] {
        assert!(out.contains(&format!("path: {path}\n")), "{path}");
    }
}

#[test]
fn the_probes_it_writes_are_what_the_agent_serves() {
    let shipped = std::fs::read_to_string(root().join("config/k8s/app-probes.injected.yaml")).unwrap();
    let line = shipped
        .lines()
        .find(|l| l.contains("/app-health/greeter/livez"))
        .unwrap();
    let json = line.trim().trim_start_matches("value: '").trim_end_matches('\'');
    let (code, out) = run_lifeguard(&["check", "--app-probers", json]);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("app_probers") && out.contains("/app-lifecycle/greeter/prestopz"),
        "{out}"
    );
}

#[test]
fn several_documents_and_other_kinds_pass_through() {
    let pod = |name: &str| {
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\nspec:\n  containers:\n  - name: sidecar\n    image: example/lifeguard:1\n  - name: app\n    image: example/app\n    readinessProbe:\n      tcpSocket:\n        port: 9000\n"
        )
    };
    let input = format!(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: c\ndata:\n  a: b\n---\n{}---\n{}",
        pod("one"),
        pod("two")
    );
    let (code, out, err) = inject(&["-"], &input);
    assert_eq!(code, 0, "{err}");
    let docs: Vec<&str> = out.split("---\n").collect();
    assert_eq!(docs.len(), 3, "{out}");
    assert!(docs[0].starts_with("apiVersion: v1\nkind: ConfigMap"), "{out}");
    for doc in &docs[1..] {
        assert!(
            doc.contains("path: /app-health/app/readyz") && doc.contains("ISTIO_KUBE_APP_PROBERS"),
            "{doc}"
        );
        assert!(
            doc.contains(r#"{\"tcpSocket\":{\"port\":9000}}"#) || doc.contains(r#""tcpSocket":{"port":9000}"#),
            "{doc}"
        );
    }
}

#[test]
fn errors_stop_with_exit_2_and_say_what_is_wrong() {
    let pod = "kind: Pod\nmetadata:\n  name: web\nspec:\n  containers:\n  - name: app\n    image: example/app\n    readinessProbe:\n      httpGet:\n        port: http\n";
    let (code, out, err) = inject(&[], pod);
    assert_eq!((code, out.as_str()), (2, ""), "{err}");
    assert_eq!(
        err,
        "lifeguard inject: document 1: Pod web: no proxy container: no container runs lifeguard; \
         add one, or name it with --proxy-container\n"
    );

    let with_proxy = pod.replace(
        "  containers:\n",
        "  containers:\n  - name: proxy\n    command: [lifeguard, run]\n",
    );
    let (code, _, err) = inject(&[], &with_proxy);
    assert_eq!(code, 2);
    assert_eq!(
        err,
        "lifeguard inject: document 1: Pod web: container app: readinessProbe: \
         the port \"http\" is not one of the container's named ports\n"
    );

    let (code, _, err) = inject(&["--proxy-container", "nope"], &with_proxy);
    assert_eq!(code, 2);
    assert!(err.contains("no container is named \"nope\""), "{err}");

    let (code, out, err) = inject(&[], "kind: ConfigMap\n---\nkind: Pod\nspec: [unclosed\n");
    assert_eq!((code, out.as_str()), (2, ""));
    assert!(err.starts_with("lifeguard inject: document 2: not YAML"), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");

    let (code, _, err) = inject(&["/nonexistent/pod.yaml"], "");
    assert_eq!(code, 2);
    assert!(err.contains("/nonexistent/pod.yaml"), "{err}");
}

/// A pod template: a lifeguard proxy and an app with a probe on a named
/// port, indented by `indent`.
fn template(indent: usize) -> String {
    let pod = "\
metadata:
  labels: {app: web}
spec:
  containers:
  - name: proxy
    image: example/lifeguard:1
    args: [run, --status-addr, 0.0.0.0:15020]
    readinessProbe:
      httpGet: {path: /healthz/ready, port: 15021}
  - name: app
    image: example/app
    ports:
    - {name: http, containerPort: 8080}
    readinessProbe:
      httpGet: {path: /ready, port: http}
    livenessProbe:
      grpc: {port: 9090}
    lifecycle:
      preStop:
        tcpSocket: {port: 8080}
";
    pod.lines().map(|l| format!("{}{l}\n", " ".repeat(indent))).collect()
}

/// Every kind with a pod, as one manifest of several documents.
fn every_kind() -> String {
    let workload = |kind: &str, api: &str| {
        format!(
            "apiVersion: {api}\nkind: {kind}\nmetadata:\n  name: web\nspec:\n  template:\n{}",
            template(4)
        )
    };
    [
        format!("apiVersion: v1\nkind: Pod\nmetadata:\n  name: web\n{}", template(0).replacen("metadata:\n  labels: {app: web}\n", "", 1)),
        workload("Deployment", "apps/v1"),
        workload("StatefulSet", "apps/v1"),
        workload("DaemonSet", "apps/v1"),
        workload("ReplicaSet", "apps/v1"),
        workload("Job", "batch/v1"),
        format!(
            "apiVersion: batch/v1\nkind: CronJob\nmetadata:\n  name: web\nspec:\n  schedule: '@daily'\n  jobTemplate:\n    spec:\n      template:\n{}",
            template(8)
        ),
        "apiVersion: v1\nkind: Service\nmetadata:\n  name: web\nspec:\n  ports:\n  - port: 80\n    targetPort: http\n".into(),
    ]
    .join("---\n")
}

/// The pod spec of a document of the output.
fn pod_spec(doc: &Value) -> &Value {
    match doc["kind"].as_str().unwrap() {
        "Pod" => &doc["spec"],
        "CronJob" => &doc["spec"]["jobTemplate"]["spec"]["template"]["spec"],
        _ => &doc["spec"]["template"]["spec"],
    }
}

fn documents(yaml: &str) -> Vec<Value> {
    yaml.split("---\n")
        .map(|d| serde_norway::from_str(d).unwrap())
        .collect()
}

fn env<'a>(container: &'a Value, name: &str) -> Option<&'a str> {
    let env = container["env"].as_sequence()?;
    env.iter().find(|e| e["name"] == name)?["value"].as_str()
}

#[test]
fn every_kind_with_a_pod_is_rewritten_and_the_agent_reads_what_it_is_handed() {
    let input = every_kind();
    let (code, out, err) = inject(&[], &input);
    assert_eq!(code, 0, "{err}");
    let before = documents(&input);
    let after = documents(&out);
    assert_eq!(after.len(), 8);
    for (doc, was) in after.iter().zip(&before) {
        let kind = doc["kind"].as_str().unwrap();
        if kind == "Service" {
            assert_eq!(doc, was, "other kinds pass through");
            continue;
        }
        let (spec, was) = (pod_spec(doc), pod_spec(was));
        let app = &spec["containers"][1];
        let get = |probe: &Value| (probe["httpGet"]["path"].clone(), probe["httpGet"]["port"].clone());
        assert_eq!(
            get(&app["readinessProbe"]),
            ("/app-health/app/readyz".into(), 15020.into()),
            "{kind}"
        );
        assert_eq!(
            get(&app["livenessProbe"]),
            ("/app-health/app/livez".into(), 15020.into()),
            "{kind}"
        );
        assert!(app["livenessProbe"].get("grpc").is_none(), "{kind}");
        let stop = &app["lifecycle"]["preStop"];
        assert_eq!(
            get(stop),
            ("/app-lifecycle/app/prestopz".into(), 15020.into()),
            "{kind}"
        );
        assert!(stop.get("tcpSocket").is_none(), "{kind}");

        // The proxy container is untouched but for the probes it is handed.
        let mut proxy = spec["containers"][0].clone();
        let json = env(&proxy, "ISTIO_KUBE_APP_PROBERS").unwrap().to_owned();
        proxy.as_mapping_mut().unwrap().remove("env");
        assert_eq!(&proxy, &was["containers"][0], "{kind}");

        let probes = AppProbes::parse(&json).unwrap();
        let paths: Vec<&str> = probes.0.keys().map(String::as_str).collect();
        assert_eq!(
            paths,
            [
                "/app-health/app/livez",
                "/app-health/app/readyz",
                "/app-lifecycle/app/prestopz"
            ],
            "{kind}"
        );
        let ready = probes.0["/app-health/app/readyz"].http_get.as_ref().unwrap();
        assert_eq!(ready.port, Port::Number(8080), "{kind}: the named port `http` resolved");
        assert_eq!(probes.0["/app-health/app/livez"].grpc.as_ref().unwrap().port, 9090);
        assert_eq!(
            probes.0["/app-lifecycle/app/prestopz"]
                .tcp_socket
                .as_ref()
                .unwrap()
                .port,
            Port::Number(8080)
        );
        assert_eq!(probes.checked().len(), 3, "{kind}: every entry is one the agent serves");
    }
    let (code, again, _) = inject(&[], &out);
    assert_eq!(
        (code, again.as_str()),
        (0, out.as_str()),
        "a second run changes nothing"
    );
}

#[test]
fn a_probe_on_the_status_port_is_left_alone() {
    // The app's readiness asks the agent itself (a probe of its own on 15020).
    let pod = "kind: Pod\nmetadata: {name: web}\nspec:\n  containers:\n  - name: proxy\n    command: [/usr/bin/lifeguard, run]\n  - name: app\n    readinessProbe:\n      httpGet: {path: /healthz/ready, port: 15020}\n      periodSeconds: 3\n    livenessProbe:\n      tcpSocket: {port: 8080}\n";
    let (code, out, err) = inject(&[], pod);
    assert_eq!(code, 0, "{err}");
    let doc = &documents(&out)[0];
    let app = &doc["spec"]["containers"][1];
    assert_eq!(app["readinessProbe"]["httpGet"]["path"], "/healthz/ready");
    assert_eq!(
        app["readinessProbe"]["httpGet"].as_mapping().unwrap().len(),
        2,
        "as written"
    );
    assert_eq!(app["livenessProbe"]["httpGet"]["path"], "/app-health/app/livez");
    let probes = AppProbes::parse(env(&doc["spec"]["containers"][0], "ISTIO_KUBE_APP_PROBERS").unwrap()).unwrap();
    assert_eq!(probes.0.keys().collect::<Vec<_>>(), ["/app-health/app/livez"]);
}

#[test]
fn the_proxy_container_can_be_named_and_the_status_port_given() {
    let pod = "kind: Pod\nmetadata: {name: web}\nspec:\n  containers:\n  - name: envoy\n    image: envoyproxy/envoy\n  - name: app\n    readinessProbe:\n      tcpSocket: {port: 8080}\n";
    let (code, out, err) = inject(&["--proxy-container", "envoy", "--status-port", "15120"], pod);
    assert_eq!(code, 0, "{err}");
    let doc = &documents(&out)[0];
    assert_eq!(doc["spec"]["containers"][1]["readinessProbe"]["httpGet"]["port"], 15120);
    assert!(env(&doc["spec"]["containers"][0], "ISTIO_KUBE_APP_PROBERS").is_some());
}
