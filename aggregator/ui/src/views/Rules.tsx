// Recording rules: the list, a form to create one (prefilled when coming from a flame-graph
// frame), and delete. Rules turn profiles into Prometheus counters served at /exported-metrics.

import { useState } from "preact/hooks";
import { ApiError, type Rule, api } from "../api";
import { ErrorBox } from "../components/controls";
import { useLoad } from "../hooks";
import { parseSelector, splitApp } from "../query";
import { type Params, navigate } from "../url";

/** A Prometheus metric name suggested for counting `fn` of the query's app. */
function suggestName(expr: string, fn: string): string {
  const { service, type } = splitApp(parseSelector(expr).app);
  const base = [service, fn.split(/[./:]+/).filter(Boolean).slice(-2).join("_"), type].filter(Boolean).join("_");
  const clean = base.replace(/[^A-Za-z0-9_]+/g, "_").replace(/_+/g, "_").replace(/^_|_$/g, "").toLowerCase();
  return /^[a-z_]/.test(clean) ? clean : `rule_${clean}`;
}

export function Rules(props: { params: Params; refresh: number }) {
  const p = props.params;
  const [version, setVersion] = useState(0);
  const list = useLoad(JSON.stringify([version, props.refresh]), () => api.rules());
  const [name, setName] = useState(p.ruleFunction ? suggestName(p.ruleExpr ?? "", p.ruleFunction) : "");
  const [expr, setExpr] = useState(p.ruleExpr ?? "");
  const [node, setNode] = useState(p.ruleNode ?? "");
  const [fn, setFn] = useState(p.ruleFunction ?? "");
  const [groupBy, setGroupBy] = useState("");
  const [error, setError] = useState<unknown>(null);
  const [done, setDone] = useState<string | null>(null);
  const [busy, setBusy] = useState(false);

  const create = async (event: Event) => {
    event.preventDefault();
    setBusy(true);
    setError(null);
    setDone(null);
    try {
      const rule: Rule = {
        name: name.trim(),
        expr: expr.trim(),
        node: node.trim(),
        function: fn.trim(),
        group_by: groupBy
          .split(",")
          .map((g) => g.trim())
          .filter(Boolean),
      };
      const created = await api.createRule(rule);
      setDone(created.name);
      setVersion((v) => v + 1);
      navigate({ ruleExpr: undefined, ruleFunction: undefined, ruleNode: undefined }, false);
    } catch (e) {
      setError(e);
    } finally {
      setBusy(false);
    }
  };

  const remove = async (rule: Rule) => {
    if (!window.confirm(`Delete recording rule ${rule.name}? Its counter disappears from /exported-metrics.`)) return;
    setError(null);
    setDone(null);
    try {
      await api.deleteRule(rule.name);
      setVersion((v) => v + 1);
    } catch (e) {
      setError(e);
    }
  };

  return (
    <section aria-label="Recording rules" class="rules">
      <p class="muted">
        A recording rule counts, as it is ingested, what the profiles matching a selector spend in a frame, and serves the
        counter at <a href="exported-metrics">/exported-metrics</a> for Prometheus to scrape and alert on. CPU counts in
        seconds.
      </p>
      <form class="rule-form" onSubmit={create} data-testid="rule-form">
        <h2>New rule</h2>
        <label>
          Metric name
          <input required value={name} onInput={(e) => setName(e.currentTarget.value)} placeholder="checkout_json_marshal_cpu" data-testid="rule-name" />
        </label>
        <label>
          Selector (FlameQL; empty: every series)
          <input value={expr} onInput={(e) => setExpr(e.currentTarget.value)} placeholder='checkout.cpu{env="prod"}' data-testid="rule-expr" />
        </label>
        <label>
          Function (exact frame name; optional)
          <input value={fn} onInput={(e) => setFn(e.currentTarget.value)} placeholder="encoding/json.Marshal" data-testid="rule-function" />
        </label>
        <label>
          Stack regex (over the root-first, ;-joined stack; empty or “total”: the whole profile)
          <input value={node} onInput={(e) => setNode(e.currentTarget.value)} placeholder="handler;.*Marshal" data-testid="rule-node" />
        </label>
        <label>
          Group by (label names, comma-separated)
          <input value={groupBy} onInput={(e) => setGroupBy(e.currentTarget.value)} placeholder="env, region" data-testid="rule-group-by" />
        </label>
        <button type="submit" disabled={busy} data-testid="rule-create">
          Create rule
        </button>
        {done && (
          <span class="ok" role="status">
            Created {done}; see <a href="exported-metrics">/exported-metrics</a>.
          </span>
        )}
      </form>
      {error !== null && <ErrorBox error={error} />}
      {list.error instanceof ApiError && list.error.status === 404 ? (
        <div class="error" role="alert" data-testid="error">
          This aggregator has no recording-rules API (<code>/api/recording-rules</code> answered 404): it predates
          metrics from profiles. Upgrade it to list and create rules here.
        </div>
      ) : (
        list.error !== null && <ErrorBox error={list.error} />
      )}
      <h2>Rules</h2>
      <table class="top-table" data-testid="rules-table">
        <thead>
          <tr>
            <th>Name</th>
            <th>Selector</th>
            <th>Function</th>
            <th>Stack regex</th>
            <th>Group by</th>
            <th />
          </tr>
        </thead>
        <tbody>
          {(list.data?.rules ?? []).map((rule) => (
            <tr key={rule.name}>
              <td>
                <code>{rule.name}</code>
              </td>
              <td>
                <code>{rule.expr || "(every series)"}</code>
              </td>
              <td>{rule.function || <span class="muted">—</span>}</td>
              <td>{rule.node || <span class="muted">total</span>}</td>
              <td>{rule.group_by.join(", ") || <span class="muted">—</span>}</td>
              <td>
                {rule.provisioned ? (
                  <span class="muted" title="Defined in the configuration file; change it there">
                    from config
                  </span>
                ) : (
                  <button type="button" onClick={() => remove(rule)} aria-label={`Delete rule ${rule.name}`}>
                    Delete
                  </button>
                )}
              </td>
            </tr>
          ))}
          {list.data && list.data.rules.length === 0 && (
            <tr>
              <td colSpan={6} class="muted">
                No rules yet. Create one above, or from a flame-graph frame (“Create rule”).
              </td>
            </tr>
          )}
        </tbody>
      </table>
    </section>
  );
}
