//! Rule maps as the recording-rules API and config files send them: never panics, and what
//! compiles evaluates over a profile and renders without panicking.
#![no_main]

use std::time::UNIX_EPOCH;

use libfuzzer_sys::fuzz_target;
use smolder_common::rules::{Counters, RuleSet};
use smolder_common::{Profile, ProfileMeta, Tree};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let Ok(rules) = RuleSet::from_map_json(text) else { return };
    let mut tree = Tree::new();
    tree.insert_names(["main", "handler", "slowFunction"], 7);
    tree.insert_names(["main", "gc"], 3);
    tree.insert_names(Vec::<&str>::new(), 1);
    let profile = Profile {
        series: "app.cpu{env=prod,region=eu}".parse().expect("a valid series"),
        meta: ProfileMeta::default(),
        from: UNIX_EPOCH,
        until: UNIX_EPOCH,
        tree,
    };
    let mut counters = Counters::new(&rules);
    counters.apply(rules.evaluate(&profile));
    let _ = counters.render();
});
