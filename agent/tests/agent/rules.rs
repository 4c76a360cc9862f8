//! Rules on the agent: Pyroscope's documented example evaluated on every closed window and
//! served on `/exported-metrics`; an invalid rule stops the agent from starting.

use std::time::{Duration, Instant, SystemTime};

use smolder_agent::app;
use smolder_agent::config::Config;
use smolder_common::{Profile, ProfileMeta, Tree};
use smolder_test_support::prometheus::Metrics;
use smolder_test_support::rules::DOCUMENTED_RULES;

/// Two instances of the Go example app: `slowFunction` does four times `fastFunction`'s work.
const STACKS: [(&str, &[(&str, u64)]); 2] = [
    (
        "simple.golang.app.cpu{env=prod}",
        &[
            ("runtime.main;main.main;main.slowFunction;main.work", 412),
            ("runtime.main;main.main;main.fastFunction;main.work", 103),
            ("runtime.main;main.main;main.slowFunction", 7),
        ],
    ),
    (
        "simple.golang.app.cpu{env=staging}",
        &[
            ("runtime.main;main.main;main.slowFunction;main.work", 390),
            ("runtime.main;main.main;main.fastFunction;main.work", 98),
            ("runtime.gcBgMarkWorker;runtime.gcDrain", 4),
        ],
    ),
];

fn config(rules: &str) -> Config {
    let mut config: Config = serde_norway::from_str(rules).expect("the documented rules load");
    config = crate::util::isolated(config);
    config.window.length = Duration::from_secs(1);
    config.window.settle = Duration::from_millis(100);
    config
}

/// CPU seconds of the stacks of `trees` that contain `needle`, computed from the trees.
fn seconds(trees: &[&Tree], needle: &str) -> f64 {
    let mut samples = 0u64;
    for tree in trees {
        tree.for_each_stack(|stack, value| {
            let names: Vec<&str> = stack.iter().map(|&f| tree.frames().name(f)).collect();
            if names.join(";").contains(needle) {
                samples += value;
            }
        });
    }
    samples as f64 / 100.0
}

#[tokio::test]
async fn pyroscope_documentation_example_on_every_window() {
    let agent = app::start(config(DOCUMENTED_RULES)).await.unwrap();
    let submitter = agent.submitter();
    let mut trees = Vec::new();
    for (series, stacks) in STACKS {
        let mut tree = Tree::new();
        for (stack, value) in stacks {
            tree.insert_names(stack.split(';'), *value);
        }
        let now = SystemTime::now();
        submitter
            .submit(Profile {
                series: series.parse().unwrap(),
                meta: ProfileMeta {
                    spy_name: "ebpfspy".to_owned(),
                    sample_rate: 100,
                    ..ProfileMeta::default()
                },
                from: now - Duration::from_millis(500),
                until: now,
                tree: tree.clone(),
            })
            .await
            .unwrap();
        trees.push(tree);
    }
    let url = format!("http://{}/exported-metrics", agent.addr());
    let deadline = Instant::now() + Duration::from_secs(15);
    let got = loop {
        let response = reqwest::get(&url).await.unwrap();
        assert_eq!(response.status(), 200);
        let got = Metrics::parse(&response.text().await.unwrap()).expect("Prometheus text");
        if got
            .find("a_simple_app_slow_env", &[("env", "staging")])
            .is_some()
            && got
                .find("a_simple_app_slow_env", &[("env", "prod")])
                .is_some()
        {
            break got;
        }
        assert!(Instant::now() < deadline, "windows not evaluated: {got:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let close = |name: &str, labels: &[(&str, &str)], want: f64| {
        let value = got.value(name, labels);
        assert!(
            (value - want).abs() < 1e-9,
            "{name}: got {value}, want {want}"
        );
    };
    close(
        "a_simple_app_total",
        &[],
        seconds(&[&trees[0], &trees[1]], ""),
    );
    close("a_simple_app_total", &[], 10.14);
    close(
        "a_simple_app_slow_env_prod",
        &[],
        seconds(&[&trees[0]], "slowFunction"),
    );
    close(
        "a_simple_app_slow_env",
        &[("env", "prod")],
        seconds(&[&trees[0]], "slowFunction"),
    );
    close(
        "a_simple_app_slow_env",
        &[("env", "staging")],
        seconds(&[&trees[1]], "slowFunction"),
    );
    let metrics = Metrics::scrape(&format!("http://{}/metrics", agent.addr())).await;
    assert_eq!(metrics.value("smolder_agent_rules_loaded", &[]), 3.0);
    // The agent stops once every submitter is gone.
    drop(submitter);
    agent.stop().await.unwrap();
}

#[tokio::test]
async fn an_invalid_rule_stops_the_agent_naming_it() {
    let err = app::start(config(
        "metrics-export-rules:\n  app-slow:\n    node: slowFunction\n",
    ))
    .await
    .err()
    .expect("refused");
    let text = format!("{err:#}");
    assert!(
        text.contains("rule \"app-slow\": invalid metric name"),
        "{text}"
    );
}
