//! `lifeguard inject`, the real binary: the shipped example rewritten as
//! checked in, idempotence, stdin, several documents, errors, and the
//! result read back by the agent.

mod common;

use std::path::PathBuf;

use common::*;

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
    assert!(err.contains("Pod web: no proxy container"), "{err}");

    let with_proxy = pod.replace(
        "  containers:\n",
        "  containers:\n  - name: proxy\n    command: [lifeguard, run]\n",
    );
    let (code, _, err) = inject(&[], &with_proxy);
    assert_eq!(code, 2);
    assert!(
        err.contains("container app: readinessProbe: the port \"http\""),
        "{err}"
    );

    let (code, _, err) = inject(&["--proxy-container", "nope"], &with_proxy);
    assert_eq!(code, 2);
    assert!(err.contains("no container is named \"nope\""), "{err}");

    let (code, _, err) = inject(&[], "kind: Pod\nspec: [unclosed\n");
    assert_eq!(code, 2);
    assert!(err.contains("not YAML"), "{err}");

    let (code, _, err) = inject(&["/nonexistent/pod.yaml"], "");
    assert_eq!(code, 2);
    assert!(err.contains("/nonexistent/pod.yaml"), "{err}");
}
