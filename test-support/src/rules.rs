//! Rules both tiers' tests evaluate.

/// The `metrics-export-rules` of Pyroscope's metrics-export documentation, as its users write
/// them: a config section either daemon reads unchanged.
pub const DOCUMENTED_RULES: &str = r#"
metrics-export-rules:
  a_simple_app_total:
    expr: simple.golang.app.cpu
    node: total
  a_simple_app_slow_env_prod:
    expr: simple.golang.app.cpu{env="prod"}
    node: slowFunction
  a_simple_app_slow_env:
    expr: simple.golang.app.cpu
    node: slowFunction
    group_by: [env]
"#;
