//! The docs that are written from the code stay in step with it:
//! `docs/configuration.md` is the settings' own reference
//! (`lifeguard::config::reference`). Run with `LIFEGUARD_UPDATE_DOCS=1` to
//! rewrite it after changing a setting.

use std::path::Path;

fn in_step(file: &str, expected: &str) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(file);
    if std::env::var_os("LIFEGUARD_UPDATE_DOCS").is_some() {
        std::fs::write(&path, expected).unwrap();
    }
    let actual = std::fs::read_to_string(&path).unwrap_or_default();
    if actual != expected {
        let line = actual
            .lines()
            .zip(expected.lines())
            .position(|(a, b)| a != b)
            .map_or(actual.lines().count().min(expected.lines().count()), |n| n)
            + 1;
        panic!("{file} is out of step with the code from line {line}: run `LIFEGUARD_UPDATE_DOCS=1 cargo test --test docs`");
    }
}

#[test]
fn the_configuration_reference_is_the_settings_own() {
    let reference = lifeguard::config::reference();
    assert!(
        reference.contains("| `--poll-interval DURATION` | `LIFEGUARD_POLL_INTERVAL` | `envoy.poll_interval` | `1s` |")
    );
    in_step("docs/configuration.md", &reference);
}

/// GitHub's anchor of a heading: lower case, punctuation but `-` and `_`
/// dropped, spaces as `-`.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, '-' | '_' | ' '))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

#[test]
fn every_link_between_the_docs_lands_on_a_page_and_a_heading() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut pages: Vec<std::path::PathBuf> = vec![root.join("README.md"), root.join("bench/README.md")];
    for entry in std::fs::read_dir(root.join("docs")).unwrap().flatten() {
        pages.push(entry.path());
    }
    let headings = |page: &Path| -> Vec<String> {
        let text = std::fs::read_to_string(page).unwrap_or_default();
        let mut fenced = false;
        let mut out = Vec::new();
        for line in text.lines() {
            fenced ^= line.starts_with("```");
            if !fenced && line.starts_with('#') {
                out.push(anchor(line.trim_start_matches('#')));
            }
        }
        out
    };
    let mut broken = Vec::new();
    let mut links = 0;
    for page in &pages {
        let text = std::fs::read_to_string(page).unwrap();
        for (i, _) in text.match_indices("](") {
            let target: String = text[i + 2..].chars().take_while(|c| *c != ')').collect();
            if target.starts_with("http") || target.contains(' ') {
                continue;
            }
            links += 1;
            let (file, heading) = target.split_once('#').unwrap_or((&target, ""));
            let dest = if file.is_empty() {
                page.clone()
            } else {
                page.parent().unwrap().join(file)
            };
            if !dest.exists() {
                broken.push(format!("{}: {target} (no such file)", page.display()));
            } else if !heading.is_empty() && dest.is_file() && !headings(&dest).iter().any(|h| h == heading) {
                broken.push(format!("{}: {target} (no such heading)", page.display()));
            }
        }
    }
    assert!(links > 30, "the docs were not read: {links} links");
    assert!(broken.is_empty(), "{broken:#?}");
}

/// `lifeguard completions SHELL` and `lifeguard man` describe the whole
/// command line: every subcommand, and the settings with their env names.
#[test]
fn completions_and_the_man_page_cover_every_command() {
    let run = |args: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_lifeguard"))
            .args(args)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    let commands = [
        "run",
        "check",
        "wait",
        "wait-app-exit",
        "inject",
        "drain",
        "completions",
        "man",
    ];
    for shell in ["bash", "zsh", "fish", "elvish", "powershell"] {
        let script = run(&["completions", shell]);
        for command in commands {
            assert!(script.contains(command), "{shell} completions lack {command}");
        }
        assert!(
            script.contains("drain-wait-unhealthy-threshold"),
            "{shell}: no run option"
        );
    }
    let man = run(&["man"]);
    assert!(
        man.starts_with(".ie") && man.contains(".TH lifeguard 1"),
        "{}",
        &man[..200]
    );
    for command in commands {
        assert!(
            man.contains(&format!(".TH lifeguard-{command} 1")),
            "the man page lacks {command}"
        );
    }
    for env in [
        "LIFEGUARD_POLL_INTERVAL",
        "TERMINATION_GRACE_PERIOD",
        "ISTIO_KUBE_APP_PROBERS",
        "LIFEGUARD_CONTROL_SOCKET",
    ] {
        assert!(man.contains(env), "the man page lacks {env}");
    }
}
