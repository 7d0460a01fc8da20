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
    assert!(reference.contains("| `--poll-interval DURATION` | `LIFEGUARD_POLL_INTERVAL` | `poll_interval` | `1s` |"));
    in_step("docs/configuration.md", &reference);
}
