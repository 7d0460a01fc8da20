//! Envoy's inbound listeners, for the drain wait (envoy/inbound.rs): the
//! masked `/config_dump` answer, which listeners count, the stats filter
//! asked of Envoy, and the total of new connections and requests read back.
//!
//! Input: a flags byte (bit 0: the `all` drain scope; bit 1: ports 15021
//! and 15090 ignored), then NUL-separated: the dump's body, a `/stats` body.
//! Holds: a dump that is JSON with `configs` a list (or no `configs`) is
//! read, anything else refused with a reason; every listener wanted (inbound,
//! or any with `all`) and not on an ignored port is counted by its stat name
//! or named as left out, and nothing else is counted; `all` counts at least
//! what `inbound` does; the filter is a regex that keeps every line the total
//! reads (Envoy's filtered answer totals the same as the whole one); no
//! listener named totals 0; ignoring more ports never totals more; nothing
//! panics.
#![no_main]

use libfuzzer_sys::fuzz_target;
use lifeguard::fuzzing::{
    inbound_dumped_listeners, inbound_filter, inbound_select, inbound_total, stats_lines, StatValue,
};
use lifeguard_fuzz::{fields, flags, text};

fuzz_target!(|data: &[u8]| {
    let (flags, rest) = flags(data);
    let (all, ignore) = (flags & 1 == 1, flags & 2 == 2);
    let ignored: &[u16] = if ignore { &[15021, 15090] } else { &[] };
    let f = fields(rest, 2);
    let (dump, stats) = (text(f[0]), text(f[1]));

    let json: Option<serde_json::Value> = serde_json::from_str(&dump).ok();
    let readable = json
        .as_ref()
        .is_some_and(|j| matches!(j.get("configs"), None | Some(serde_json::Value::Array(_))));
    let listeners = match inbound_dumped_listeners(&dump) {
        Ok(listeners) => {
            assert!(readable, "{dump:?} was read");
            let configs = json.as_ref().and_then(|j| j.get("configs")).and_then(|c| c.as_array());
            assert!(listeners.len() <= configs.map_or(0, Vec::len));
            listeners
        }
        Err(why) => {
            assert!(!readable, "{dump:?} refused: {why}");
            assert!(!why.0.is_empty());
            Vec::new()
        }
    };

    let (counted, skipped) = inbound_select(&listeners, all, ignored);
    let mut sorted = counted.clone();
    sorted.sort();
    sorted.dedup();
    assert_eq!(counted, sorted, "counted once each, in order");
    let wanted = |(_, inbound, port): &&(Option<String>, bool, Option<u16>)| {
        (all || *inbound) && !port.is_some_and(|p| ignored.contains(&p))
    };
    for name in &counted {
        assert!(
            listeners.iter().filter(wanted).any(|l| l.0.as_deref() == Some(name)),
            "{name} counted but not wanted"
        );
    }
    for name in listeners.iter().filter(wanted).filter_map(|l| l.0.as_ref()) {
        assert!(counted.contains(name), "{name} wanted but not counted");
    }
    assert_eq!(
        skipped.len(),
        listeners.iter().filter(wanted).filter(|l| l.0.is_none()).count()
    );
    if !all {
        let (every, _) = inbound_select(&listeners, true, ignored);
        assert!(counted.iter().all(|n| every.contains(n)));
    }

    // Envoy answers the filter with the lines whose name it matches: the
    // total of that answer is the total of the whole.
    for names in [Some(counted.as_slice()), None] {
        let filter = inbound_filter(names);
        let regex = regex::Regex::new(&filter).unwrap_or_else(|e| panic!("{filter:?}: {e}"));
        let kept: String = stats_lines(&stats)
            .into_iter()
            .filter(|l| regex.is_match(l.name))
            .filter_map(|l| match l.value {
                StatValue::Number(n) => Some(format!("{}: {n}\n", l.name)),
                _ => None,
            })
            .collect();
        assert_eq!(
            inbound_total(&kept, names, ignored),
            inbound_total(&stats, names, ignored),
            "{filter:?} drops a counted line"
        );
    }
    assert_eq!(inbound_total(&stats, Some(&[]), ignored), 0);
    assert!(inbound_total(&stats, None, &[15021, 15090]) <= inbound_total(&stats, None, &[]));
});
