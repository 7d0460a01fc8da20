//! Envoy's inbound listeners, for the drain wait (envoy/inbound.rs): a
//! `/config_dump` answer, which listeners count and by what, the stats
//! filter asked of Envoy, and the arrivals read back.
//!
//! Input: a flags byte (bit 0: the `all` drain scope; bit 1: ports 15021
//! and 15090 ignored), then NUL-separated: the dump's body, a `/stats` body.
//! Holds: a dump that is JSON with `configs` a list (or no `configs`) is
//! read, anything else refused with a reason; every listener chosen is
//! wanted (inbound, or any with `all`), not on an ignored port and named,
//! and every such listener is chosen, each once; `all` chooses at least
//! what `inbound` does; the filter is a regex that keeps every line the
//! total reads (Envoy's filtered answer totals the same as the whole one);
//! a selection of nothing totals no arrivals; ignoring more ports never
//! totals more; nothing panics.

use super::{fields, flags, text};
use lifeguard::fuzzing::{
    dumped_listeners, inbound_choose, inbound_filter, inbound_total, stats_lines, Counted, DrainScope, Listener,
    Selection, StatValue,
};

/// One input, as the fuzz target runs it: panics when a promise above is broken.
pub fn run(data: &[u8]) {
    let (flags, rest) = flags(data);
    let (all, ignore) = (flags & 1 == 1, flags & 2 == 2);
    let scope = if all { DrainScope::All } else { DrainScope::Inbound };
    let ignored: &[u16] = if ignore { &[15021, 15090] } else { &[] };
    let f = fields(rest, 2);
    let (dump, stats) = (text(f[0]), text(f[1]));

    let json: Option<serde_json::Value> = serde_json::from_str(&dump).ok();
    let readable = json
        .as_ref()
        .is_some_and(|j| matches!(j.get("configs"), None | Some(serde_json::Value::Array(_))));
    let listeners = match dumped_listeners(&dump) {
        Ok(listeners) => {
            assert!(readable, "{dump:?} was read");
            let configs = json.as_ref().and_then(|j| j.get("configs")).and_then(|c| c.as_array());
            assert!(listeners.len() <= configs.map_or(0, Vec::len));
            listeners
        }
        Err(why) => {
            assert!(!readable, "{dump:?} refused: {why}");
            assert!(!why.to_string().is_empty());
            Vec::new()
        }
    };

    let wanted = |l: &&Listener| (all || l.inbound) && !l.port.is_some_and(|p| ignored.contains(&p));
    let (chosen, words) = inbound_choose(&listeners, scope, ignored);
    assert!(!words.is_empty());
    let named: Vec<&String> = listeners
        .iter()
        .filter(wanted)
        .filter_map(|l| l.stat_name.as_ref())
        .collect();
    match &chosen {
        Counted::Chosen(Selection {
            listeners: counted,
            bare,
            ..
        }) => {
            let mut sorted = counted.clone();
            sorted.sort();
            sorted.dedup();
            assert_eq!(counted, &sorted, "counted once each, in order");
            for name in counted {
                assert!(named.contains(&name), "{name} counted but not wanted");
            }
            for name in &named {
                assert!(counted.contains(name), "{name} wanted but not counted");
            }
            for name in bare {
                assert!(counted.contains(name), "{name} counted by connections but not chosen");
            }
            assert!(!counted.is_empty());
            if !all {
                let Counted::Chosen(every) = inbound_choose(&listeners, DrainScope::All, ignored).0 else {
                    panic!("inbound chosen, so all too");
                };
                assert!(counted.iter().all(|n| every.listeners.contains(n)));
            }
        }
        Counted::Every => assert!(named.is_empty(), "{named:?} wanted but nothing chosen"),
    }

    // Envoy answers the filter with the lines whose name it matches: the
    // total of that answer is the total of the whole.
    for chosen in [chosen.clone(), Counted::Every] {
        let filter = inbound_filter(&chosen);
        let regex = regex::Regex::new(&filter).unwrap_or_else(|e| panic!("{filter:?}: {e}"));
        let kept: String = stats_lines(&stats)
            .filter(|l| regex.is_match(l.name))
            .filter_map(|l| match l.value {
                StatValue::Number(n) => Some(format!("{}: {n}\n", l.name)),
                _ => None,
            })
            .collect();
        assert_eq!(
            inbound_total(&kept, &chosen, ignored),
            inbound_total(&stats, &chosen, ignored),
            "{filter:?} drops a counted line"
        );
    }
    let nothing = Counted::Chosen(Selection::default());
    assert_eq!(inbound_total(&stats, &nothing, ignored).0, 0);
    let every = Counted::Every;
    assert!(inbound_total(&stats, &every, &[15021, 15090]).0 <= inbound_total(&stats, &every, &[]).0);
}
