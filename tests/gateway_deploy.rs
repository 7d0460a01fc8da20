//! A gateway operator deploys from the repository: `config/k8s/gateway/`,
//! a kustomize base and an overlay per kind of load balancer. Each overlay
//! renders (`kubectl kustomize`, as the operator runs it), validates
//! against the Kubernetes API's schemas, keeps the production defaults of
//! the base, and has a grace period that covers its load balancer's
//! checks: the same numbers its load balancer is given (annotations, a
//! BackendConfig) are lifeguard's `--load-balancer-checks`, and `lifeguard
//! check` says the grace period covers them. A manifest whose grace period
//! cannot fails, naming the overlay and the numbers.

use std::path::PathBuf;
use std::process::Command;

/// `lifeguard check` with a container's `env` (the values given inline):
/// its exit code and what it said.
fn check_with_env(container: &Value) -> (Option<i32>, String) {
    let mut cmd = Command::new(lifeguard_bin());
    cmd.arg("check").env_clear();
    for e in container["env"].as_sequence().into_iter().flatten() {
        if let Some(value) = e["value"].as_str() {
            cmd.env(e["name"].as_str().unwrap(), value);
        }
    }
    let out = cmd.output().unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code(), said)
}

use serde_norway::Value;

use common::{kustomize, lifeguard_bin, root};

/// Every overlay, by directory name.
const OVERLAYS: [&str; 5] = ["aws-nlb-ip", "aws-nlb-instance", "gke-neg", "node-checked", "metallb"];

fn gateway_dir() -> PathBuf {
    root().join("config/k8s/gateway")
}

/// The rendered document of `kind`.
fn doc<'a>(docs: &'a [Value], kind: &str) -> &'a Value {
    docs.iter()
        .find(|d| d["kind"] == kind)
        .unwrap_or_else(|| panic!("no {kind}"))
}

/// The proxy container of the rendered Deployment.
fn proxy(docs: &[Value]) -> &Value {
    let containers = doc(docs, "Deployment")["spec"]["template"]["spec"]["containers"]
        .as_sequence()
        .unwrap();
    assert_eq!(containers.len(), 1, "the proxy is a gateway pod's only container");
    &containers[0]
}

/// The proxy's env variable `name`, if set.
fn env(docs: &[Value], name: &str) -> Option<String> {
    proxy(docs)["env"]
        .as_sequence()?
        .iter()
        .find(|e| e["name"] == name)
        .and_then(|e| e["value"].as_str().map(str::to_owned))
}

/// The load balancer's checks as its own configuration gives them:
/// (interval seconds, unhealthy threshold).
fn load_balancer_checks(overlay: &str, docs: &[Value]) -> (u64, u64) {
    let number = |v: &Value| {
        v.as_u64()
            .or_else(|| v.as_str().and_then(|s| s.parse().ok()))
            .unwrap_or_else(|| panic!("{overlay}: not a number: {v:?}"))
    };
    match overlay {
        "aws-nlb-ip" | "aws-nlb-instance" => {
            let annotations = &doc(docs, "Service")["metadata"]["annotations"];
            let a = |key: &str| {
                number(&annotations[format!("service.beta.kubernetes.io/aws-load-balancer-{key}").as_str()])
            };
            (a("healthcheck-interval"), a("healthcheck-unhealthy-threshold"))
        }
        "gke-neg" => {
            let check = &doc(docs, "BackendConfig")["spec"]["healthCheck"];
            (number(&check["checkIntervalSec"]), number(&check["unhealthyThreshold"]))
        }
        // GKE's L4 load balancer's own health check of the nodes for a
        // Local Service (its controller's defaults: ingress-gce
        // healthchecksl4.go); Azure's, an F5's: the operator's.
        "node-checked" => (3, 2),
        other => panic!("no load balancer known for {other}"),
    }
}

/// Whether `overlay`'s rendering `docs` has a grace period that covers its
/// load balancer: lifeguard is told the load balancer's own numbers, reads
/// the pod's grace period, and `lifeguard check` (run with the proxy's
/// env) says each fits. The reason when not, naming the overlay and the
/// numbers.
fn grace_covers_its_load_balancer(overlay: &str, docs: &[Value]) -> Result<String, String> {
    let grace = doc(docs, "Deployment")["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
        .as_u64()
        .ok_or(format!("{overlay}: no terminationGracePeriodSeconds"))?;
    let told = env(docs, "TERMINATION_GRACE_PERIOD");
    if told.as_deref() != Some(grace.to_string().as_str()) {
        return Err(format!(
            "{overlay}: TERMINATION_GRACE_PERIOD is {told:?}, the pod's grace period {grace} s"
        ));
    }
    if overlay == "metallb" {
        return grace_covers_its_announcer(docs, grace);
    }
    let (interval, threshold) = load_balancer_checks(overlay, docs);
    let checks = format!("{interval}sx{threshold}");
    let declared = env(docs, "LIFEGUARD_LOAD_BALANCER_CHECKS");
    if declared.as_deref() != Some(checks.as_str()) {
        return Err(format!(
            "{overlay}: LIFEGUARD_LOAD_BALANCER_CHECKS is {declared:?}, its load balancer checks every {interval} s, out after {threshold}"
        ));
    }
    let (code, said) = check_with_env(proxy(docs));
    let line = said
        .lines()
        .find(|l| l.contains("(--load-balancer-checks) needs a grace period"))
        .unwrap_or_default()
        .to_owned();
    let policy = said.lines().find(|l| l.starts_with("drain_until ")).unwrap_or_default();
    if !policy.contains("out-of-rotation") {
        return Err(format!("{overlay}: the policy is not out-of-rotation: {policy}"));
    }
    // A checker of the pod is let go no sooner than it takes.
    if let Some(timeout) = env(docs, "LIFEGUARD_DRAIN_WAIT_CHECKER_TIMEOUT") {
        let timeout: u64 = timeout
            .trim_end_matches('s')
            .parse()
            .map_err(|_| format!("{overlay}: {timeout}"))?;
        if timeout < interval * threshold {
            return Err(format!(
                "{overlay}: LIFEGUARD_DRAIN_WAIT_CHECKER_TIMEOUT ({timeout} s) lets its checker go before its {} s",
                interval * threshold
            ));
        }
    }
    match code {
        Some(0) if line.ends_with("it fits") => Ok(line),
        code => Err(format!(
            "{overlay}: its grace period ({grace} s) does not cover its load balancer's checks (every {interval} s, out after {threshold}): lifeguard check exited {code:?}: {said}"
        )),
    }
}

/// The `metallb` overlay: no load balancer checks the node, MetalLB's
/// speaker withdraws it once the kubelet has seen the pod fail
/// failureThreshold probes (its readinessProbe, which
/// LIFEGUARD_KUBELET_PROBE repeats), the kubelet told 503 from the drain's
/// start; `lifeguard check` holds the grace period to that.
fn grace_covers_its_announcer(docs: &[Value], grace: u64) -> Result<String, String> {
    let probe = &proxy(docs)["readinessProbe"];
    let number = |key: &str| probe[key].as_u64().ok_or(format!("metallb: no readinessProbe.{key}"));
    let declared = format!("{}sx{}", number("periodSeconds")?, number("failureThreshold")?);
    if env(docs, "LIFEGUARD_KUBELET_PROBE").as_deref() != Some(declared.as_str()) {
        return Err(format!(
            "metallb: LIFEGUARD_KUBELET_PROBE is {:?}, the readinessProbe {declared}",
            env(docs, "LIFEGUARD_KUBELET_PROBE")
        ));
    }
    if env(docs, "LIFEGUARD_TERMINATING_READINESS").as_deref() != Some("failing") {
        return Err("metallb: nothing checks the node: the kubelet should be told 503 at once".into());
    }
    if let Some(checks) = env(docs, "LIFEGUARD_LOAD_BALANCER_CHECKS") {
        return Err(format!(
            "metallb: MetalLB checks no node, yet LIFEGUARD_LOAD_BALANCER_CHECKS is {checks}"
        ));
    }
    let (code, said) = check_with_env(proxy(docs));
    let line = said
        .lines()
        .find(|l| l.starts_with("an announcer that follows the EndpointSlice (MetalLB) needs a grace period"))
        .unwrap_or_default()
        .to_owned();
    match code {
        Some(0) if line.ends_with("it fits") && line.contains("(--kubelet-probe)") => Ok(line),
        code => Err(format!(
            "metallb: its grace period ({grace} s) does not cover the announcer's withdrawal: lifeguard check exited {code:?}: {said}"
        )),
    }
}

/// The Service's annotation `service.beta.kubernetes.io/aws-load-balancer-{key}`.
fn aws_annotation<'a>(docs: &'a [Value], key: &str) -> Option<&'a str> {
    doc(docs, "Service")["metadata"]["annotations"]
        [format!("service.beta.kubernetes.io/aws-load-balancer-{key}").as_str()]
    .as_str()
}

/// The target group attributes the Service's annotation sets, by name.
fn target_group_attributes(annotations: &Value) -> Vec<(String, String)> {
    annotations["service.beta.kubernetes.io/aws-load-balancer-target-group-attributes"]
        .as_str()
        .unwrap_or_default()
        .split(',')
        .filter_map(|pair| pair.split_once('='))
        .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
        .collect()
}

/// An NLB's target group (the AWS Load Balancer Controller's annotations)
/// that keeps a target's connections while its gateway may still serve
/// them, `grace` seconds at most: an unhealthy target's are not reset
/// (`target_health_state.unhealthy.connection_termination.enabled` is
/// true by default) and are kept the draining interval; a deregistered
/// one's, when `deregistered`, for the deregistration delay (300 s by
/// default), not cut at its end.
fn keeps_a_targets_connections(what: &str, annotations: &Value, grace: u64, deregistered: bool) -> Result<(), String> {
    let attributes = target_group_attributes(annotations);
    let attribute = |name: &str| attributes.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str());
    let seconds = |name: &str| attribute(name).and_then(|v| v.parse::<u64>().ok());
    if attribute("target_health_state.unhealthy.connection_termination.enabled") != Some("false") {
        return Err(format!(
            "{what}: the NLB resets an unhealthy target's connections (connection termination is on by default)"
        ));
    }
    match seconds("target_health_state.unhealthy.draining_interval_seconds") {
        Some(s) if s >= grace => {}
        other => {
            return Err(format!(
                "{what}: an unhealthy target's connections are kept {other:?} s, not the grace period ({grace} s)"
            ))
        }
    }
    if deregistered {
        if seconds("deregistration_delay.timeout_seconds").unwrap_or(300) < grace {
            return Err(format!(
                "{what}: a deregistered target drains for less than the grace period"
            ));
        }
        if attribute("deregistration_delay.connection_termination.enabled") == Some("true") {
            return Err(format!("{what}: a deregistered target's connections are cut"));
        }
    }
    Ok(())
}

/// An overlay's load balancer takes a new pod in before the rollout moves
/// on, and lets a deleted one go without cutting what it still serves:
/// - the NLB overlays' target groups keep a target's connections for the
///   grace period (`keeps_a_targets_connections`); their health checks
///   are HTTP (the controller's default for IP targets is TCP, which a
///   draining gateway never fails) on the pod's readiness (IP targets);
/// - `aws-nlb-instance`: minReadySeconds covers a node's healthy
///   threshold of checks at their interval, one answered at its timeout,
///   and a second for kube-proxy; `aws-nlb-ip`: the controller's readiness
///   gate is asked for (the namespace's label);
/// - `gke-neg`: the BackendConfig drains a removed endpoint's connections
///   for the grace period (0, off, by default).
fn takes_pods_in_and_lets_them_go(overlay: &str, docs: &[Value]) -> Result<(), String> {
    let deployment = doc(docs, "Deployment");
    let grace = deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
        .as_u64()
        .unwrap();
    let min_ready = deployment["spec"]["minReadySeconds"].as_u64().unwrap_or(0);
    let number = |key: &str| aws_annotation(docs, key).and_then(|v| v.parse::<u64>().ok());
    match overlay {
        "aws-nlb-ip" | "aws-nlb-instance" => {
            let annotations = &doc(docs, "Service")["metadata"]["annotations"];
            keeps_a_targets_connections(overlay, annotations, grace, overlay == "aws-nlb-ip")?;
            if aws_annotation(docs, "healthcheck-protocol") != Some("HTTP") {
                return Err(format!("{overlay}: the NLB's health check is not HTTP"));
            }
        }
        _ => {}
    }
    match overlay {
        "aws-nlb-instance" => {
            let (interval, healthy, timeout) = (
                number("healthcheck-interval").unwrap(),
                number("healthcheck-healthy-threshold").unwrap(),
                number("healthcheck-timeout").unwrap(),
            );
            let takes = healthy * interval + timeout + 1;
            if min_ready < takes {
                return Err(format!(
                    "{overlay}: minReadySeconds {min_ready} moves on before the NLB takes a node in ({healthy} x {interval} s + {timeout} s + 1 s)"
                ));
            }
        }
        "aws-nlb-ip" => {
            let readiness = proxy(docs)["readinessProbe"]["httpGet"].clone();
            if number("healthcheck-port") != readiness["port"].as_u64()
                || aws_annotation(docs, "healthcheck-path") != readiness["path"].as_str()
            {
                return Err(format!("{overlay}: the NLB does not check the pod's readiness"));
            }
            let label = &doc(docs, "Namespace")["metadata"]["labels"]["elbv2.k8s.aws/pod-readiness-gate-inject"];
            if label != "enabled" {
                return Err(format!("{overlay}: no pod readiness gate"));
            }
        }
        "gke-neg" => {
            let draining = doc(docs, "BackendConfig")["spec"]["connectionDraining"]["drainingTimeoutSec"].as_u64();
            if draining != Some(grace) {
                return Err(format!(
                    "{overlay}: the BackendConfig drains a removed endpoint {draining:?} s, not the grace period ({grace} s)"
                ));
            }
        }
        _ => {}
    }
    Ok(())
}

#[test]
fn every_overlay_renders_validates_and_its_grace_period_covers_its_load_balancer() {
    for overlay in OVERLAYS {
        let dir = gateway_dir().join("overlays").join(overlay);
        let docs = kustomize(&dir);
        let line = grace_covers_its_load_balancer(overlay, &docs).unwrap_or_else(|e| panic!("{e}"));
        eprintln!("{overlay}: {line}");
        // What every overlay keeps of the base: production defaults.
        let pod = &doc(&docs, "Deployment")["spec"]["template"]["spec"];
        let proxy = proxy(&docs);
        let security = &proxy["securityContext"];
        assert_eq!(pod["securityContext"]["runAsNonRoot"], true, "{overlay}");
        assert_eq!(
            pod["securityContext"]["seccompProfile"]["type"], "RuntimeDefault",
            "{overlay}"
        );
        assert_eq!(security["allowPrivilegeEscalation"], false, "{overlay}");
        assert_eq!(security["readOnlyRootFilesystem"], true, "{overlay}");
        assert_eq!(security["capabilities"]["drop"][0], "ALL", "{overlay}");
        assert!(proxy["resources"]["requests"]["cpu"].is_string(), "{overlay}: requests");
        assert!(proxy["resources"]["limits"]["memory"].is_string(), "{overlay}: limits");
        assert_eq!(
            doc(&docs, "PodDisruptionBudget")["spec"]["maxUnavailable"],
            1,
            "{overlay}"
        );
        let spread = pod["topologySpreadConstraints"].as_sequence().unwrap();
        assert_eq!(spread.len(), 2, "{overlay}");
        for constraint in spread {
            assert_eq!(
                constraint["matchLabelKeys"][0], "pod-template-hash",
                "{overlay}: a rollout's old pods are counted against its new ones"
            );
        }
        takes_pods_in_and_lets_them_go(overlay, &docs).unwrap_or_else(|e| panic!("{e}"));
        assert!(
            doc(&docs, "Deployment")["spec"]["minReadySeconds"].as_u64() > Some(0),
            "{overlay}"
        );
        assert_eq!(
            doc(&docs, "Namespace")["metadata"]["labels"]["pod-security.kubernetes.io/enforce"],
            "restricted"
        );
        assert_eq!(env(&docs, "LIFEGUARD_DRAIN_SCOPE").as_deref(), Some("all"), "{overlay}");
        for probe in ["readinessProbe", "startupProbe"] {
            assert_eq!(proxy[probe]["httpGet"]["path"], "/healthz/ready", "{overlay}: {probe}");
        }
        // The status port is not published on the load balancer.
        let ports = doc(&docs, "Service")["spec"]["ports"].as_sequence().unwrap();
        assert!(
            ports.iter().all(|p| p["port"].as_u64() != Some(15021)),
            "{overlay}: 15021 published"
        );
        validate(overlay, &docs);
    }
}

/// `kubernetes-validate` on the rendered documents; kinds of other APIs
/// (GKE's BackendConfig) have no schema there and are checked above.
fn validate(overlay: &str, docs: &[Value]) {
    let dir = common::temp_dir("kustomized");
    let file = dir.path().join(format!("{overlay}.yaml"));
    std::fs::write(&file, common::container::yaml_documents(docs)).unwrap();
    let out = Command::new("kubernetes-validate")
        .args(["--strict", "--kubernetes-version", "1.30.0"])
        .arg(&file)
        .output()
        .unwrap_or_else(|e| panic!("kubernetes-validate ({e}): pip install kubernetes-validate (scripts/test does)"));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{overlay}: kubernetes-validate:\n{text}");
    let ours = docs.iter().filter(|d| d["apiVersion"] != "cloud.google.com/v1").count();
    assert_eq!(text.matches("passed for resource").count(), ours, "{overlay}: {text}");
}

/// Bad input: an overlay whose grace period cannot cover its load balancer
/// (an operator's overlay of the NLB's, its checks slowed to every 60 s)
/// fails, the message naming the overlay and the numbers.
#[test]
fn an_overlay_whose_grace_period_cannot_cover_its_load_balancer_fails_naming_it() {
    // An operator's overlay beside the shipped ones, over the NLB's.
    let dir = common::temp_dir("overlay");
    let tree = dir.path().join("gateway");
    for part in ["base", "overlays/aws-nlb-instance"] {
        copy_dir(&gateway_dir().join(part), &tree.join(part));
    }
    let overlay = tree.join("overlays/slow-nlb");
    std::fs::create_dir(&overlay).unwrap();
    std::fs::write(
        overlay.join("kustomization.yaml"),
        "resources:\n- ../aws-nlb-instance\npatches:\n- target: {kind: Service, name: ingress-gateway}\n  patch: |-\n    - op: replace\n      path: /metadata/annotations/service.beta.kubernetes.io~1aws-load-balancer-healthcheck-interval\n      value: \"60\"\n- target: {kind: Deployment, name: ingress-gateway}\n  patch: |-\n    - op: replace\n      path: /spec/template/spec/containers/0/env/4/value\n      value: 60sx2\n",
    )
    .unwrap();
    let docs = kustomize(&overlay);
    assert_eq!(env(&docs, "LIFEGUARD_LOAD_BALANCER_CHECKS").as_deref(), Some("60sx2"));
    let error = grace_covers_its_load_balancer("aws-nlb-instance", &docs).unwrap_err();
    assert!(
        error.starts_with("aws-nlb-instance: its grace period (90 s) does not cover its load balancer's checks (every 60 s, out after 2)")
            && error.contains("needs a grace period of 130s"),
        "{error}"
    );
    // Told numbers other than its load balancer's: named too.
    let mut docs = docs;
    let annotations = &mut docs.iter_mut().find(|d| d["kind"] == "Service").unwrap()["metadata"]["annotations"];
    annotations["service.beta.kubernetes.io/aws-load-balancer-healthcheck-interval"] = Value::from("10");
    let error = grace_covers_its_load_balancer("aws-nlb-instance", &docs).unwrap_err();
    assert!(
        error.contains("LIFEGUARD_LOAD_BALANCER_CHECKS is Some(\"60sx2\"), its load balancer checks every 10 s"),
        "{error}"
    );
    // Its NLB left to reset an unhealthy node's connections (the target
    // group's default): named too.
    let annotations = &mut docs.iter_mut().find(|d| d["kind"] == "Service").unwrap()["metadata"]["annotations"];
    annotations
        .as_mapping_mut()
        .unwrap()
        .remove("service.beta.kubernetes.io/aws-load-balancer-target-group-attributes");
    let error = takes_pods_in_and_lets_them_go("aws-nlb-instance", &docs).unwrap_err();
    assert!(
        error.contains("the NLB resets an unhealthy target's connections"),
        "{error}"
    );
}

/// Copies the files of `from` (a directory of files) to `to`.
fn copy_dir(from: &std::path::Path, to: &std::path::Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap().flatten() {
        std::fs::copy(entry.path(), to.join(entry.file_name())).unwrap();
    }
}

/// The base's bootstrap is `config/envoy-gateway.yaml`, the image's: the
/// same file.
#[test]
fn the_bases_bootstrap_is_the_images() {
    let image = std::fs::read_to_string(root().join("config/envoy-gateway.yaml")).unwrap();
    let base = std::fs::read_to_string(gateway_dir().join("base/envoy.yaml")).unwrap();
    assert_eq!(
        base, image,
        "config/k8s/gateway/base/envoy.yaml drifted from config/envoy-gateway.yaml"
    );
    let docs = kustomize(&gateway_dir().join("base"));
    let config = doc(&docs, "ConfigMap");
    assert_eq!(config["data"]["envoy.yaml"].as_str(), Some(image.as_str()));
}

/// The rendered documents of `path` (a file of YAML documents).
fn documents(text: &str) -> Vec<Value> {
    serde_norway::Deserializer::from_str(text)
        .map(|d| serde::Deserialize::deserialize(d).unwrap())
        .collect()
}

/// The containers of a rendered workload, by name, in their order.
fn containers(workload: &Value) -> Vec<&Value> {
    workload["spec"]["template"]["spec"]["containers"]
        .as_sequence()
        .unwrap()
        .iter()
        .collect()
}

fn named<'a>(containers: &[&'a Value], name: &str) -> &'a Value {
    containers
        .iter()
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("no container {name}"))
}

/// The value of `container`'s env variable `name`.
fn env_of(container: &Value, name: &str) -> Option<String> {
    container["env"]
        .as_sequence()?
        .iter()
        .find(|e| e["name"] == name)
        .and_then(|e| e["value"].as_str().map(str::to_owned))
}

/// Envoy Gateway's proxy Deployment (its shape: `tests/fixtures/
/// envoy-gateway-deployment.yaml`) patched as Envoy Gateway patches it
/// with `config/k8s/envoy-gateway/envoyproxy.yaml` (a strategic merge, as
/// `kubectl patch --type strategic` does it): the shutdown manager gone,
/// lifeguard beside Envoy over its admin, the envoy container's readiness
/// probe and preStop hook on lifeguard, Envoy first; valid against the
/// API's schemas, lifeguard's settings good, its grace period Envoy
/// Gateway's.
#[test]
fn the_envoyproxy_resource_puts_lifeguard_in_place_of_envoy_gateways_shutdown_manager() {
    let resource = std::fs::read_to_string(root().join("config/k8s/envoy-gateway/envoyproxy.yaml")).unwrap();
    let resource = &documents(&resource)[0];
    assert_eq!(resource["apiVersion"], "gateway.envoyproxy.io/v1alpha1");
    assert_eq!(resource["kind"], "EnvoyProxy");
    let kubernetes = &resource["spec"]["provider"]["kubernetes"];
    let deployment = &as_envoy_gateway_renders_it(kubernetes);
    let list = containers(deployment);
    let names: Vec<&str> = list.iter().map(|c| c["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["envoy", "lifeguard"], "Envoy first, the shutdown manager gone");
    let envoy = named(&list, "envoy");
    assert_eq!(envoy["readinessProbe"]["httpGet"]["port"], 19002);
    assert_eq!(envoy["readinessProbe"]["httpGet"]["path"], "/healthz/ready");
    assert_eq!(envoy["lifecycle"]["preStop"]["httpGet"]["port"], 19002);
    assert_eq!(envoy["lifecycle"]["preStop"]["httpGet"]["path"], "/drain/stopped");
    assert!(
        envoy["livenessProbe"].is_null(),
        "Envoy's /ready fails during a drain: no liveness on it"
    );
    let rendered = std::fs::read_to_string(root().join("tests/fixtures/envoy-gateway-deployment.yaml")).unwrap();
    let rendered = &documents(&rendered)[0];
    assert_eq!(
        envoy["args"],
        named(&containers(rendered), "envoy")["args"],
        "Envoy Gateway's own arguments kept"
    );
    let lifeguard = named(&list, "lifeguard");
    // Envoy Gateway's admin: 127.0.0.1:19000, or [::1]:19000 on an
    // IPv6-only cluster; `localhost` is either.
    assert_eq!(
        env_of(lifeguard, "LIFEGUARD_ADMIN_URL").as_deref(),
        Some("http://localhost:19000")
    );
    assert_eq!(
        env_of(lifeguard, "LIFEGUARD_STATUS_ADDR").as_deref(),
        Some("0.0.0.0:19002")
    );
    // Envoy's ready listener (its health_check filter) is not counted:
    // lifeguard never calls /healthcheck/fail, which would drain-close
    // Envoy Gateway's listeners from the drain's start.
    assert_eq!(
        env_of(lifeguard, "LIFEGUARD_IGNORE_LISTENER_PORTS").as_deref(),
        Some("19001,19003")
    );
    load_balancer_checks_the_recipes_pods(resource, envoy, lifeguard);
    let grace = deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
        .as_u64()
        .unwrap();
    let drain_timeout: u64 = resource["spec"]["shutdown"]["drainTimeout"]
        .as_str()
        .and_then(|d| d.strip_suffix('s'))
        .and_then(|d| d.parse().ok())
        .unwrap();
    assert_eq!(
        drain_timeout + 300,
        grace,
        "Envoy Gateway's grace period: drainTimeout + 300 s"
    );
    assert_eq!(
        env_of(lifeguard, "TERMINATION_GRACE_PERIOD"),
        Some(grace.to_string()),
        "lifeguard is told Envoy Gateway's grace period"
    );
    let (code, said) = check_with_env(lifeguard);
    assert_eq!(code, Some(0), "{said}");
    assert!(
        said.contains("drain_until") && said.contains("out-of-rotation"),
        "{said}"
    );
    spread_and_disruption_budget(kubernetes, deployment);
}

/// Envoy Gateway's proxy Deployment as its controller renders it with the
/// EnvoyProxy's `kubernetes` provider: `envoyDeployment.pod`'s fields in
/// its Deployment, then the strategic-merge patch (resource_provider.go;
/// `kubectl patch --type strategic` merges as it does).
fn as_envoy_gateway_renders_it(kubernetes: &Value) -> Value {
    let patch = &kubernetes["envoyDeployment"]["patch"];
    assert_eq!(patch["type"], "StrategicMerge");
    let dir = common::temp_dir("envoy-gateway");
    let fixture = std::fs::read_to_string(root().join("tests/fixtures/envoy-gateway-deployment.yaml")).unwrap();
    let mut generated = documents(&fixture).remove(0);
    generated["spec"]["template"]["spec"]["topologySpreadConstraints"] =
        kubernetes["envoyDeployment"]["pod"]["topologySpreadConstraints"].clone();
    let generated_file = dir.path().join("deployment.yaml");
    std::fs::write(&generated_file, serde_norway::to_string(&generated).unwrap()).unwrap();
    let patch_file = dir.path().join("patch.json");
    std::fs::write(&patch_file, serde_json::to_string(&patch["value"]).unwrap()).unwrap();
    let out = Command::new("kubectl")
        .args(["patch", "--local", "--type", "strategic", "-o", "yaml", "-f"])
        .arg(&generated_file)
        .arg("--patch-file")
        .arg(&patch_file)
        .output()
        .unwrap_or_else(|e| panic!("kubectl ({e}): it is on every machine here"));
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "kubectl patch: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    documents(&text).remove(0)
}

/// The proxies spread across zones and nodes, counting only the same
/// Gateway's pods of the same ReplicaSet, and the PodDisruptionBudget
/// Envoy Gateway renders from `envoyPDB` (its selector the proxies' stable
/// labels): one proxy at a time; the Deployment and the budget valid
/// against the API's schemas.
fn spread_and_disruption_budget(kubernetes: &Value, deployment: &Value) {
    let spread = &kubernetes["envoyDeployment"]["pod"]["topologySpreadConstraints"];
    assert_eq!(
        &deployment["spec"]["template"]["spec"]["topologySpreadConstraints"], spread,
        "the spread as the EnvoyProxy gives it"
    );
    for constraint in spread.as_sequence().expect("topologySpreadConstraints") {
        let keys = constraint["matchLabelKeys"].as_sequence().unwrap();
        assert!(
            keys.iter().any(|k| k == "pod-template-hash"),
            "a rollout's old pods counted: {constraint:?}"
        );
    }
    let pdb = &kubernetes["envoyPDB"];
    assert_eq!(pdb["maxUnavailable"], 1, "one proxy at a time");
    let selector = serde_json::json!({ "matchLabels": deployment["spec"]["selector"]["matchLabels"] });
    let pdb: Value = serde_norway::from_str(
        &serde_json::json!({
            "apiVersion": "policy/v1",
            "kind": "PodDisruptionBudget",
            "metadata": { "name": "envoy-default-eg-3f2a1b", "namespace": "envoy-gateway-system" },
            "spec": { "maxUnavailable": pdb["maxUnavailable"].as_u64(), "selector": selector },
        })
        .to_string(),
    )
    .unwrap();
    validate("envoy-gateway", &[deployment.clone(), pdb]);
}

/// The NLB of the EnvoyProxy's `envoyService` annotations (the AWS Load
/// Balancer Controller reads them) checks each pod where lifeguard answers
/// the load balancers, over HTTP (its default for IP targets is TCP on the
/// traffic port, which a draining Envoy never fails), as often as
/// lifeguard is told; its target group keeps a pod's connections while
/// Envoy may serve them; and lifeguard's grace period covers its checks.
fn load_balancer_checks_the_recipes_pods(resource: &Value, envoy: &Value, lifeguard: &Value) {
    let annotations = &resource["spec"]["provider"]["kubernetes"]["envoyService"]["annotations"];
    let a = |key: &str| {
        annotations[format!("service.beta.kubernetes.io/aws-load-balancer-{key}").as_str()]
            .as_str()
            .unwrap_or_else(|| panic!("no {key} annotation"))
            .to_owned()
    };
    assert_eq!(a("nlb-target-type"), "ip");
    assert_eq!(a("healthcheck-protocol"), "HTTP", "the controller's default is TCP");
    let status_port = env_of(lifeguard, "LIFEGUARD_STATUS_ADDR")
        .and_then(|addr| addr.rsplit_once(':').map(|(_, p)| p.to_owned()))
        .unwrap();
    assert_eq!(a("healthcheck-port"), status_port, "lifeguard's status port");
    assert_eq!(
        a("healthcheck-port"),
        envoy["readinessProbe"]["httpGet"]["port"].as_u64().unwrap().to_string()
    );
    assert_eq!(
        a("healthcheck-path"),
        envoy["readinessProbe"]["httpGet"]["path"].as_str().unwrap()
    );
    let checks = format!(
        "{}sx{}",
        a("healthcheck-interval"),
        a("healthcheck-unhealthy-threshold")
    );
    assert_eq!(env_of(lifeguard, "LIFEGUARD_LOAD_BALANCER_CHECKS"), Some(checks));
    let grace: u64 = env_of(lifeguard, "TERMINATION_GRACE_PERIOD").unwrap().parse().unwrap();
    keeps_a_targets_connections("envoy-gateway", annotations, grace, true).unwrap_or_else(|e| panic!("{e}"));
}

/// Contour's Envoy DaemonSet (its shape: `tests/fixtures/contour-envoy.yaml`)
/// with `config/k8s/contour`'s patch, rendered by kustomize: the shutdown
/// manager gone, lifeguard beside Envoy on the admin's Unix socket, the
/// envoy container's readiness probe and preStop hook on lifeguard.
#[test]
fn the_contour_patch_puts_lifeguard_in_place_of_contours_shutdown_manager() {
    let dir = common::temp_dir("contour");
    let contour = root().join("config/k8s/contour");
    for file in ["kustomization.yaml", "lifeguard-patch.yaml"] {
        std::fs::copy(contour.join(file), dir.path().join(file)).unwrap();
    }
    std::fs::copy(
        root().join("tests/fixtures/contour-envoy.yaml"),
        dir.path().join("contour.yaml"),
    )
    .unwrap();
    let docs = kustomize(dir.path());
    let daemonset = doc(&docs, "DaemonSet");
    let list = containers(daemonset);
    let names: Vec<&str> = list.iter().map(|c| c["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["envoy", "lifeguard"], "Envoy first, the shutdown manager gone");
    let envoy = named(&list, "envoy");
    assert_eq!(envoy["readinessProbe"]["httpGet"]["port"], 8090);
    assert_eq!(envoy["lifecycle"]["preStop"]["httpGet"]["path"], "/drain/stopped");
    let lifeguard = named(&list, "lifeguard");
    assert_eq!(lifeguard["image"], "registry.example.com/lifeguard-envoy:0.1.0");
    assert_eq!(
        env_of(lifeguard, "LIFEGUARD_ADMIN_URL").as_deref(),
        Some("unix:///admin/admin.sock")
    );
    assert_eq!(lifeguard["volumeMounts"][0]["name"], "envoy-admin");
    assert_eq!(lifeguard["volumeMounts"][0]["mountPath"], "/admin");
    assert_eq!(
        lifeguard["securityContext"]["runAsUser"], 65534,
        "the admin socket's owner"
    );
    let grace = daemonset["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
        .as_u64()
        .unwrap();
    assert_eq!(env_of(lifeguard, "TERMINATION_GRACE_PERIOD"), Some(grace.to_string()));
    let (code, said) = check_with_env(lifeguard);
    assert_eq!(code, Some(0), "{said}");
    validate("contour", &docs);
}
