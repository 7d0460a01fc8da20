//! Containers for real, with podman (Debian 12's podman 4.3 and runc;
//! `scripts/test` installs them): the lifeguard-envoy image that
//! `scripts/image` builds from the top-level Containerfile, a small app
//! image built here, and pods played from Kubernetes YAML with
//! `podman kube play`.
//!
//! What podman 4.3 needs on these machines, and what it does differently
//! from a kubelet (seen here, or reported in issue #28 where marked; each
//! is handled in one place below):
//!
//! - **The runtime is runc** (`[engine] runtime`): crun refuses the hybrid
//!   cgroup layout of these machines, v1 controllers beside a v2 mount
//!   (#28; Debian's podman package does not pull crun in).
//! - **`default_ulimits = []`**: podman raises a root container's
//!   RLIMIT_NOFILE to 1048576, above this sandbox's hard limit, and runc
//!   then fails with "error setting rlimit type 7: operation not
//!   permitted". With no default the containers inherit podman's limits.
//!   Both settings are in the kit's own containers.conf, given to every
//!   podman call through `CONTAINERS_CONF`: the machine's configuration is
//!   left alone.
//! - **Networking**: a pod takes no `--network ns:PATH`, and containerPorts
//!   become host port mappings, which need a bridge (in Kubernetes they are
//!   informational). So a pod is played with `--network none` (its own
//!   namespace, loopback only), without containerPorts, and the test names
//!   that namespace through the pod's infra process ([`PlayedPod::net`]):
//!   a veth pair joins it to a peer namespace the test creates, on
//!   addresses that exist only in those two namespaces. Clients (the
//!   kubelet's probes, requests) and the services the app calls live there.
//! - **Workloads**: a Deployment's `replicas` become that many pods sharing
//!   its volumes (podman makes every pod volume a named volume of the
//!   host), and its containers are restarted when they exit. A kubelet
//!   deleting a pod restarts nothing. So the Deployment is played as one
//!   `Pod` of its template with `restartPolicy: Never`, and the pod's
//!   volumes and ConfigMaps are named after the test ([`kube_pod`]).
//! - **Termination**: `podman stop` of one container in a shared PID
//!   namespace signals, and at its end kills, processes of the other
//!   containers too (#28). The kubelet's runtime signals each container's
//!   own process. So the test plays the kubelet ([`PlayedPod::delete`]):
//!   each container's preStop hook, then SIGTERM to its process, and at
//!   the grace period SIGKILL to what is left in each container's cgroup
//!   ([`PlayedPod::sigkill`]).
//! - **What podman 4.3 does not run**: probes (the test probes through the
//!   pod's network as the kubelet does, [`kubelet_probe`]) and lifecycle
//!   hooks (the test runs them: `exec` in the container with `podman
//!   exec`, `httpGet` on the pod's address from outside); it mounts no
//!   termination-message file (a hostPath file is mounted at the
//!   container's `terminationMessagePath`, as the kubelet bind-mounts one).
//! - **The pod's PID 1** with `shareProcessNamespace` is podman's infra
//!   process, `catatonit -P`, where Kubernetes has `pause`; an emptyDir of
//!   `medium: Memory` is a volume on disk. Neither changes what lifeguard
//!   does (it takes either name for the pod's PID 1).
//!
//! Everything created here is removed, also when a test fails: pods and
//! their volumes when the [`PlayedPod`] drops, the images this process
//! built when it exits (they are built once and shared by its tests; the
//! removal is registered with `atexit`, which runs after the last test,
//! failed or not). Names carry the test process's pid. Needs root.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use crate::netns::{Net, Netns};
use crate::{envoy_bin, envoy_version_of, temp_dir, unique, wait_for, TempDir};

/// The kit's containers.conf (see the module doc).
const CONTAINERS_CONF: &str = "\
# Written by lifeguard's test kit (tests/common/container.rs).
[containers]
default_ulimits = []

[engine]
runtime = \"runc\"
";

/// The kit's containers.conf on disk: one file for every test process (its
/// content never changes), written atomically.
fn containers_conf() -> &'static Path {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| {
        let path = std::env::temp_dir().join("lifeguard-test-containers.conf");
        let tmp = path.with_extension(format!("conf.{}", std::process::id()));
        std::fs::write(&tmp, CONTAINERS_CONF).unwrap();
        std::fs::rename(&tmp, &path).unwrap();
        path
    })
}

/// `podman ARGS...` with the kit's configuration.
pub fn podman_command(args: &[&str]) -> Command {
    let mut cmd = Command::new("podman");
    cmd.args(args).env("CONTAINERS_CONF", containers_conf());
    cmd
}

/// Runs `podman ARGS...` to its end.
pub fn podman(args: &[&str]) -> Output {
    podman_command(args).output().unwrap_or_else(|e| {
        panic!("cannot run podman ({e}): `apt-get install podman runc catatonit` (scripts/test does)")
    })
}

/// `podman ARGS...`, which must succeed: its stdout.
pub fn podman_ok(args: &[&str]) -> String {
    let out = podman(args);
    assert!(
        out.status.success(),
        "podman {}: {}{}",
        args.join(" "),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

// ---------------------------------------------------------------------------
// Images: built once per test process, removed when it exits

/// The image of a pod's infra process, which podman builds when a pod
/// first needs it (tagged with podman's version and build time).
const INFRA_IMAGE: &str = "localhost/podman-pause";

/// The tags of [`INFRA_IMAGE`] there are.
fn infra_images() -> Vec<String> {
    let filter = format!("reference={INFRA_IMAGE}");
    podman_ok(&["images", "--filter", &filter, "--format", "{{.Repository}}:{{.Tag}}"])
        .lines()
        .map(str::to_owned)
        .collect()
}

/// What this process created that outlives a test: removed at exit.
static CREATED_IMAGES: Mutex<Vec<String>> = Mutex::new(Vec::new());

extern "C" fn remove_images() {
    let images = std::mem::take(&mut *CREATED_IMAGES.lock().unwrap_or_else(|e| e.into_inner()));
    // The app image first, then the proxy, then its base: each may be
    // removed once nothing is built on it.
    for image in images.iter().rev() {
        // Not forced for the infra image: another pod may use it.
        let force = if image.starts_with(INFRA_IMAGE) {
            "--ignore"
        } else {
            "--force"
        };
        let _ = podman(&["rmi", force, image]);
    }
}

/// Registers `image` for removal at exit, before it is built (a build that
/// fails half-way leaves nothing either); once.
pub fn remove_at_exit(image: &str) {
    static REGISTER: std::sync::Once = std::sync::Once::new();
    REGISTER.call_once(|| {
        // SAFETY: registering a plain function with atexit(3).
        unsafe {
            libc::atexit(remove_images);
        }
    });
    let mut images = CREATED_IMAGES.lock().unwrap();
    if !images.iter().any(|i| i == image) {
        images.push(image.to_owned());
    }
}

/// The images the container tests use.
pub struct Images {
    /// The base built from the Envoy binary (`scripts/image --local-base`).
    pub base: String,
    /// lifeguard-envoy, from the Containerfile.
    pub proxy: String,
    /// The app (see `app_image`).
    pub app: String,
    /// The Envoy version in the base (`x.y.z`).
    pub envoy_version: String,
    /// The lifeguard binary in `proxy`: `$LIFEGUARD_TEST_IMAGE_BINARY`
    /// (`scripts/image --binary`) when set, else the release's
    /// `dist/lifeguard`.
    pub binary: PathBuf,
    /// Whether `binary` is the release's (built by `scripts/release`: no
    /// debug info inside).
    pub release: bool,
    /// How long `scripts/image` took (the release build included when it
    /// had to run).
    pub build_time: Duration,
    /// `scripts/image`'s output.
    pub build_log: String,
}

/// The images, built on first use: lifeguard-envoy by `scripts/image
/// --local-base` from the Envoy binary the suite runs ([`envoy_bin`]) and
/// the lifeguard of `$LIFEGUARD_TEST_IMAGE_BINARY` (scripts/test's own
/// build, static), or without it the release's (`scripts/release`, built
/// when needed); the app from the host's python. Panics with the build's
/// output when a build fails.
pub fn images() -> &'static Images {
    static IMAGES: OnceLock<Images> = OnceLock::new();
    IMAGES.get_or_init(|| {
        let pid = std::process::id();
        let envoy_version = envoy_version_of(&envoy_bin());
        let base = format!("localhost/lifeguard-test-envoy-{pid}:{envoy_version}");
        let proxy = format!("localhost/lifeguard-test-envoy-lifeguard-{pid}:test");
        let app = format!("localhost/lifeguard-test-app-{pid}:1");
        remove_at_exit(&base);
        remove_at_exit(&proxy);
        let started = Instant::now();
        let root = crate::root();
        let mut image = Command::new(root.join("scripts/image"));
        // Without what Cargo sets for this test's package: a build script
        // that reads one of them (ring's reads CARGO_MANIFEST_DIR) would
        // rebuild the release binary that scripts/test has just built.
        for (key, _) in std::env::vars_os() {
            let key = key.to_string_lossy();
            let per_package = ["CARGO_PKG_", "CARGO_BIN_EXE_"].iter().any(|p| key.starts_with(p))
                || [
                    "CARGO_MANIFEST_DIR",
                    "CARGO_MANIFEST_PATH",
                    "CARGO_CRATE_NAME",
                    "CARGO_BIN_NAME",
                    "CARGO_TARGET_TMPDIR",
                    "CARGO_PRIMARY_PACKAGE",
                    "CARGO_RUSTC_CURRENT_DIR",
                ]
                .contains(&key.as_ref());
            if per_package {
                image.env_remove(key.as_ref());
            }
        }
        let given = std::env::var_os("LIFEGUARD_TEST_IMAGE_BINARY").map(PathBuf::from);
        if let Some(binary) = &given {
            image.arg("--binary").arg(binary);
        }
        let out = image
            .args(["--local-base", "--base-tag", &base, "--tag", &proxy])
            .env("ENVOY_BIN", envoy_bin())
            .env("CONTAINERS_CONF", containers_conf())
            .env("BUILDER", "podman")
            .current_dir(root)
            .output()
            .unwrap();
        let build_time = started.elapsed();
        let build_log = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(out.status.success(), "scripts/image failed:\n{build_log}");
        remove_at_exit(&app);
        app_image(&app);
        Images {
            base,
            proxy,
            app,
            envoy_version,
            release: given.is_none(),
            binary: given.unwrap_or_else(|| root.join("dist/lifeguard")),
            build_time,
            build_log,
        }
    })
}

/// The app image: Debian's python3 (the interpreter, the C libraries it
/// links, its standard library less the tests, tools and build files: about
/// 24 MB), the pod tests' app (`tests/fixtures/pod_app.py`, the entrypoint)
/// and `app_reach.py`. Its default arguments: `fresh 2 ""`, a new
/// connection per outbound call, calls for 2 s after SIGTERM. It runs as
/// root, as many apps do: the test shows that even root in the app's
/// container cannot open the proxy's sockets.
fn app_image(tag: &str) {
    let python = Path::new("/usr/bin/python3");
    assert!(
        python.exists(),
        "the app image is built from Debian's python3: `apt-get install python3` (scripts/test does)"
    );
    let dir = temp_dir("app-image");
    let root = dir.path().join("rootfs");
    let stdlib = {
        let out = Command::new(python)
            .args(["-c", "import sysconfig; print(sysconfig.get_paths()['stdlib'])"])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    };
    assert!(stdlib.starts_with('/'), "python3's stdlib: {stdlib:?}");
    for sub in ["usr/bin", "app", "tmp"] {
        std::fs::create_dir_all(root.join(sub)).unwrap();
    }
    std::fs::copy(std::fs::canonicalize(python).unwrap(), root.join("usr/bin/python3")).unwrap();
    copy_libraries(python, &root);
    let skip = [
        "__pycache__",
        "test",
        "idlelib",
        "tkinter",
        "turtledemo",
        "ensurepip",
        "lib2to3",
        "pydoc_data",
        "dist-packages",
        "site-packages",
    ];
    let mut tar = format!("tar -C / -cf - --exclude='{}/config-*'", &stdlib[1..]);
    for s in skip {
        tar.push_str(&format!(" --exclude='{s}'"));
    }
    tar.push_str(&format!(" '{}' | tar -C '{}' -xf -", &stdlib[1..], root.display()));
    run_ok(Command::new("sh").args(["-c", &tar]));
    let fixtures = crate::root().join("tests/fixtures");
    for script in ["pod_app.py", "app_reach.py"] {
        std::fs::copy(fixtures.join(script), root.join("app").join(script)).unwrap();
    }
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(root.join("tmp"), std::fs::Permissions::from_mode(0o1777)).unwrap();
    std::fs::write(
        dir.path().join("Containerfile"),
        "FROM scratch\n\
         COPY rootfs/ /\n\
         ENTRYPOINT [\"/usr/bin/python3\", \"-I\", \"/app/pod_app.py\"]\n\
         CMD [\"fresh\", \"2\", \"\"]\n",
    )
    .unwrap();
    let context = dir.path().display().to_string();
    podman_ok(&["build", "--quiet", "-t", tag, &context]);
}

/// Copies the C libraries `binary` links (as `ldd` lists them) into
/// `root`, at the paths the loader looks for them.
pub fn copy_libraries(binary: &Path, root: &Path) {
    let out = Command::new("ldd").arg(binary).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    for path in text.split_whitespace().filter(|w| w.starts_with('/')) {
        let dest = root.join(&path[1..]);
        std::fs::create_dir_all(dest.parent().unwrap()).unwrap();
        std::fs::copy(path, &dest).unwrap_or_else(|e| panic!("copy {path}: {e}"));
    }
}

fn run_ok(cmd: &mut Command) {
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{cmd:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

// ---------------------------------------------------------------------------
// Kubernetes YAML as podman takes it

/// A manifest's pod, as podman plays it (see the module doc): the
/// ConfigMaps kept; the Deployment's template as one Pod named `name`,
/// `restartPolicy: Never`; the pod's volumes and the ConfigMaps they name
/// renamed after `name` (podman makes them volumes of the host);
/// containerPorts dropped; a hostPath file mounted at each container's
/// `terminationMessagePath` (`messages`: container → host file). Other
/// kinds (a Service) are kept: podman ignores them. Returns the YAML
/// documents.
pub fn kube_pod(docs: &[serde_norway::Value], name: &str, messages: &[(&str, &Path)]) -> Vec<serde_norway::Value> {
    use serde_norway::Value;
    let kind = |d: &Value| d["kind"].as_str().unwrap_or_default().to_owned();
    let renamed = |n: &str| format!("{name}-{n}");
    let mut out = Vec::new();
    for doc in docs {
        match kind(doc).as_str() {
            "ConfigMap" => {
                let mut map = doc.clone();
                let old = map["metadata"]["name"].as_str().unwrap().to_owned();
                map["metadata"]["name"] = Value::from(renamed(&old));
                out.push(map);
            }
            "Deployment" => {
                let template = &doc["spec"]["template"];
                let mut spec = template["spec"].clone();
                spec["restartPolicy"] = Value::from("Never");
                if let Some(volumes) = spec["volumes"].as_sequence_mut() {
                    for v in volumes {
                        let old = v["name"].as_str().unwrap().to_owned();
                        v["name"] = Value::from(renamed(&old));
                        if let Some(config) = v["configMap"]["name"].as_str().map(str::to_owned) {
                            v["configMap"]["name"] = Value::from(renamed(&config));
                        }
                    }
                }
                let containers = spec["containers"].as_sequence_mut().unwrap();
                let mut extra_volumes = Vec::new();
                for c in containers.iter_mut() {
                    let c = c.as_mapping_mut().unwrap();
                    c.remove("ports");
                    if let Some(mounts) = c.get_mut("volumeMounts").and_then(Value::as_sequence_mut) {
                        for m in mounts {
                            let old = m["name"].as_str().unwrap().to_owned();
                            m["name"] = Value::from(renamed(&old));
                        }
                    }
                    let container = c.get("name").and_then(Value::as_str).unwrap().to_owned();
                    if let Some((_, host)) = messages.iter().find(|(n, _)| *n == container) {
                        let path = c
                            .get("terminationMessagePath")
                            .and_then(Value::as_str)
                            .unwrap_or("/dev/termination-log")
                            .to_owned();
                        let volume = renamed(&format!("{container}-termination-log"));
                        let mount = map(&[("name", volume.as_str().into()), ("mountPath", path.as_str().into())]);
                        let mounts = c
                            .entry(Value::from("volumeMounts"))
                            .or_insert_with(|| Value::Sequence(Vec::new()));
                        mounts.as_sequence_mut().unwrap().push(mount);
                        let host = host.display().to_string();
                        let host_path = map(&[("path", host.as_str().into()), ("type", "File".into())]);
                        extra_volumes.push(map(&[("name", volume.as_str().into()), ("hostPath", host_path)]));
                    }
                }
                let volumes = spec
                    .as_mapping_mut()
                    .unwrap()
                    .entry(Value::from("volumes"))
                    .or_insert_with(|| Value::Sequence(Vec::new()));
                volumes.as_sequence_mut().unwrap().extend(extra_volumes);
                let mut metadata = template["metadata"].clone();
                metadata["name"] = Value::from(name);
                out.push(map(&[
                    ("apiVersion", "v1".into()),
                    ("kind", "Pod".into()),
                    ("metadata", metadata),
                    ("spec", spec),
                ]));
            }
            _ => out.push(doc.clone()),
        }
    }
    out
}

/// A YAML mapping of `entries`, in their order.
fn map(entries: &[(&str, serde_norway::Value)]) -> serde_norway::Value {
    let mut m = serde_norway::Mapping::new();
    for (k, v) in entries {
        m.insert((*k).into(), v.clone());
    }
    serde_norway::Value::Mapping(m)
}

/// YAML documents as one multi-document text.
pub fn yaml_documents(docs: &[serde_norway::Value]) -> String {
    docs.iter()
        .map(|d| serde_norway::to_string(d).unwrap())
        .collect::<Vec<_>>()
        .join("---\n")
}

// ---------------------------------------------------------------------------
// A played pod

/// A pod played with `podman kube play --network none`; removed on drop
/// with its volumes (its containers SIGKILLed at once: there is nothing
/// left to drain by then).
pub struct PlayedPod {
    // Drop order: the pod first, then the names of its network, then its
    // directory.
    removal: Removal,
    /// The pod's network, joined to a peer namespace.
    pub net: Net,
    pub dir: TempDir,
}

impl PlayedPod {
    /// Plays `docs` (written to the pod's directory), then joins the pod's
    /// network namespace to a peer namespace of the test's, on `addresses`
    /// ([`Net::addresses`]).
    pub fn play(
        name: &str,
        docs: &[serde_norway::Value],
        addresses: (std::net::Ipv4Addr, std::net::Ipv4Addr),
        dir: TempDir,
    ) -> PlayedPod {
        let file = dir.path().join("pod.yaml");
        std::fs::write(&file, yaml_documents(docs)).unwrap();
        // podman names a pod's volume after the volume, and a ConfigMap's
        // after the ConfigMap.
        let pod_volumes = docs
            .iter()
            .filter_map(|d| d["spec"]["volumes"].as_sequence())
            .flatten()
            .filter_map(|v| v["name"].as_str().map(str::to_owned));
        let config_maps = docs
            .iter()
            .filter(|d| d["kind"] == "ConfigMap")
            .filter_map(|d| d["metadata"]["name"].as_str().map(str::to_owned));
        let volumes = pod_volumes.chain(config_maps).collect();
        // podman builds its pods' infra image on first use: removed with
        // this process's images when this play made it.
        let infra_before = infra_images();
        // The guard exists before the pod does: a play that fails half-way
        // is removed all the same.
        let removal = Removal {
            name: name.to_owned(),
            volumes,
        };
        let out = podman(&["kube", "play", "--network", "none", &file.display().to_string()]);
        if infra_before.is_empty() {
            infra_images().iter().for_each(|i| remove_at_exit(i));
        }
        assert!(
            out.status.success(),
            "podman kube play: {}{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
            yaml_documents(docs)
        );
        let infra = podman_ok(&["pod", "inspect", "--format", "{{.InfraContainerID}}", name]);
        let infra_pid = container_pid(infra.trim());
        let (pid, n) = unique();
        let net = Net::around(
            Netns::attach(format!("lifeguard-{pid}-{n}-podman"), infra_pid),
            addresses,
        );
        PlayedPod { removal, net, dir }
    }

    pub fn name(&self) -> &str {
        &self.removal.name
    }

    /// A container's name in podman: `POD-CONTAINER`.
    pub fn container(&self, name: &str) -> String {
        format!("{}-{name}", self.removal.name)
    }

    /// The host pid of a container's process (the command it runs).
    pub fn pid(&self, container: &str) -> i32 {
        container_pid(&self.container(container))
    }

    /// A container's output so far (stdout and stderr).
    pub fn logs(&self, container: &str) -> String {
        let out = podman(&["logs", &self.container(container)]);
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    }

    /// Waits until a container's output has a line that contains `text`.
    pub fn wait_logs(&self, container: &str, text: &str, timeout: Duration) -> String {
        wait_for(&format!("{text:?} in the log of {container}"), timeout, || {
            let out = self.logs(container);
            if out.lines().any(|l| l.contains(text)) {
                Ok(out)
            } else {
                Err(out.lines().last().unwrap_or_default().to_owned())
            }
        })
    }

    /// `podman exec CONTAINER ARGV...` to its end: the exit code and the
    /// output.
    pub fn exec(&self, container: &str, argv: &[&str]) -> (i32, String) {
        let name = self.container(container);
        let mut args = vec!["exec", name.as_str()];
        args.extend_from_slice(argv);
        let out = podman(&args);
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (out.status.code().unwrap_or(-1), text)
    }

    /// A container's state and exit code, as podman records them.
    pub fn state(&self, container: &str) -> (String, i32) {
        let text = podman_ok(&[
            "inspect",
            "--format",
            "{{.State.Status}} {{.State.ExitCode}}",
            &self.container(container),
        ]);
        let (status, code) = text.trim().split_once(' ').unwrap();
        (status.to_owned(), code.parse().unwrap())
    }

    /// The kubelet deleting the pod (classic sidecars: every container is
    /// stopped at once): for each container, its preStop hook, then SIGTERM
    /// to its process; a container without a hook gets its SIGTERM at once.
    /// An `httpGet` hook is called on the pod's address from outside the
    /// pod, as the kubelet calls it, within `grace`; an `exec` hook runs in
    /// its container (bounded by the grace period's SIGKILL, which the
    /// caller sends). Returns when it began, and per container a thread
    /// that gives the hook's answer (status and body) and when the SIGTERM
    /// was sent.
    pub fn delete(&self, containers: &[(&str, PreStop)], grace: Duration) -> (Instant, Vec<Stopping>) {
        let pids: Vec<i32> = containers.iter().map(|(c, _)| self.pid(c)).collect();
        let t0 = Instant::now();
        let mut stopping = Vec::new();
        for ((container, hook), pid) in containers.iter().zip(pids) {
            let sigterm = move || {
                // SAFETY: kill(2) on a container process of this test's pod.
                unsafe {
                    libc::kill(pid, libc::SIGTERM);
                }
                Instant::now()
            };
            let thread = match hook {
                PreStop::None => std::thread::spawn(move || (None, sigterm())),
                PreStop::HttpGet { path, port } => {
                    let addr = self.net.pod_addr(*port);
                    let path = path.clone();
                    self.net.peer.spawn(move || {
                        let lifecycle = [("user-agent", "kube-lifecycle/1.30")];
                        let answer =
                            crate::request(addr, "GET", &path, &lifecycle, grace).map(|a| (a.status, a.text()));
                        (Some(answer), sigterm())
                    })
                }
                PreStop::Exec(argv) => {
                    let name = self.container(container);
                    let argv = argv.clone();
                    std::thread::spawn(move || {
                        let mut args = vec!["exec".to_owned(), name];
                        args.extend(argv);
                        let args: Vec<&str> = args.iter().map(String::as_str).collect();
                        let out = podman(&args);
                        let body = String::from_utf8_lossy(&out.stdout).into_owned();
                        (Some(Ok((out.status.code().unwrap_or(-1) as u16, body))), sigterm())
                    })
                }
            };
            stopping.push(thread);
        }
        (t0, stopping)
    }

    /// The kubelet at the end of the grace period: SIGKILL to every
    /// process left in each container's cgroup.
    pub fn sigkill(&self, containers: &[&str]) {
        for c in containers {
            let Ok(pid) = podman_ok(&["inspect", "--format", "{{.State.Pid}}", &self.container(c)])
                .trim()
                .parse::<i32>()
            else {
                continue;
            };
            for p in cgroup_processes(pid) {
                // SAFETY: kill(2) on a process of this test's container.
                unsafe {
                    libc::kill(p, libc::SIGKILL);
                }
            }
        }
    }

    /// Waits until podman says `container` exited (at most until
    /// `deadline`); its exit code, None when it still runs.
    pub fn wait_exit(&self, container: &str, deadline: Instant) -> Option<i32> {
        loop {
            let (status, code) = self.state(container);
            if status == "exited" || status == "stopped" {
                return Some(code);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// A container's preStop hook, as a manifest gives it.
#[derive(Debug, Clone)]
pub enum PreStop {
    None,
    HttpGet { path: String, port: u16 },
    Exec(Vec<String>),
}

impl PreStop {
    /// The hook of a container of a manifest (`lifecycle.preStop`).
    pub fn of(container: &serde_norway::Value) -> PreStop {
        let hook = &container["lifecycle"]["preStop"];
        if let Some(port) = hook["httpGet"]["port"].as_u64() {
            let path = hook["httpGet"]["path"].as_str().unwrap_or("/").to_owned();
            return PreStop::HttpGet {
                path,
                port: port as u16,
            };
        }
        if let Some(argv) = hook["exec"]["command"].as_sequence() {
            return PreStop::Exec(argv.iter().map(|a| a.as_str().unwrap().to_owned()).collect());
        }
        assert!(hook.is_null(), "a preStop hook the kit does not run: {hook:?}");
        PreStop::None
    }
}

/// A container being stopped: the preStop hook's answer (None without a
/// hook), and when its SIGTERM was sent.
pub type Stopping = std::thread::JoinHandle<(Option<std::io::Result<(u16, String)>>, Instant)>;

/// Waits until `GET path` on `addr`, sent as the kubelet's probes are
/// (`User-Agent: kube-probe/…`), answers 200; from the calling thread's
/// network namespace.
pub fn kubelet_probe(addr: std::net::SocketAddr, path: &str, timeout: Duration) {
    wait_for(&format!("the kubelet's probe of {addr}{path}"), timeout, || {
        let probe = [("user-agent", "kube-probe/1.30")];
        match crate::request(addr, "GET", path, &probe, Duration::from_secs(10)) {
            Ok(answer) if answer.status == 200 => Ok(()),
            Ok(answer) => Err(format!("{} {}", answer.status, answer.text())),
            Err(e) => Err(e.to_string()),
        }
    })
}

impl Drop for PlayedPod {
    /// On a failure, every container's output (the pod is removed after).
    fn drop(&mut self) {
        if std::thread::panicking() {
            let names = podman_ok(&[
                "ps",
                "--all",
                "--filter",
                &format!("pod={}", self.name()),
                "--format",
                "{{.Names}}",
            ]);
            for c in names.lines().filter(|n| !n.ends_with("-infra")) {
                let out = podman(&["logs", c]);
                eprintln!(
                    "----- podman logs {c} -----\n{}{}",
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                );
            }
        }
    }
}

/// A pod and the volumes its YAML names (podman keeps ConfigMap volumes
/// after the pod): removed on drop, its containers SIGKILLed at once.
struct Removal {
    name: String,
    volumes: Vec<String>,
}

impl Drop for Removal {
    fn drop(&mut self) {
        let _ = podman(&["pod", "rm", "--force", "--time", "0", &self.name]);
        for v in &self.volumes {
            let _ = podman(&["volume", "rm", "--force", v]);
        }
    }
}

/// The host pid of a running container's process.
pub fn container_pid(container: &str) -> i32 {
    let text = podman_ok(&["inspect", "--format", "{{.State.Pid}}", container]);
    let pid: i32 = text.trim().parse().unwrap();
    assert!(pid > 0, "{container} is not running");
    pid
}

/// Every process in the `pids` cgroup of `pid` (a container's).
pub fn cgroup_processes(pid: i32) -> Vec<i32> {
    let Ok(groups) = std::fs::read_to_string(format!("/proc/{pid}/cgroup")) else {
        return Vec::new();
    };
    let Some(path) = groups
        .lines()
        .find_map(|l| l.split_once(":pids:").map(|(_, p)| p.to_owned()))
    else {
        return Vec::new();
    };
    std::fs::read_to_string(format!("/sys/fs/cgroup/pids{path}/cgroup.procs"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect()
}
