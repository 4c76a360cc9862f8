// The top table: one row per function with its self and total, sortable by either, filtered by
// the search. Clicking a function highlights it in the flame graph.

import type { ComponentChildren } from "preact";
import { useMemo } from "preact/hooks";
import { type Units, formatPercent, formatValue } from "../format";
import { type FlameModel, type TableRow, topTable } from "../model";

/** Rows rendered at most; the rest are reachable by search or sort. */
const ROW_LIMIT = 500;

export type SortKey = "self" | "total" | "name" | "change";

export interface TableProps {
  model: FlameModel;
  units: Units;
  search: string;
  sort: SortKey;
  onSort: (key: SortKey) => void;
  onPick: (name: string) => void;
  /** The function under the pointer or keyboard focus, or null when it leaves the table. */
  onHover?: (name: string | null) => void;
  actions?: (name: string) => ComponentChildren;
}

function change(row: TableRow, model: FlameModel): number {
  const d = model.diff!;
  const l = d.leftTicks > 0 ? row.totalL! / d.leftTicks : 0;
  const r = d.rightTicks > 0 ? row.totalR! / d.rightTicks : 0;
  return (r - l) * 100;
}

export function Table(props: TableProps) {
  const { model, units, search, sort } = props;
  const all = useMemo(() => topTable(model), [model]);
  const [rows, matching] = useMemo(() => {
    const filtered = search ? all.filter((r) => r.name.toLowerCase().includes(search)) : all.slice();
    const key = (r: TableRow): number | string => {
      if (sort === "name") return r.name;
      if (sort === "change" && model.diff) return change(r, model);
      if (model.diff && sort === "total") return r.totalL!;
      return sort === "self" ? r.self : r.total;
    };
    filtered.sort((a, b) => {
      const ka = key(a);
      const kb = key(b);
      if (typeof ka === "string") return ka.localeCompare(kb as string);
      return (kb as number) - (ka as number) || a.name.localeCompare(b.name);
    });
    return [filtered.slice(0, ROW_LIMIT), filtered.length] as const;
  }, [all, search, sort]);

  const header = (key: SortKey, label: string) => (
    <th aria-sort={sort === key ? (key === "name" ? "ascending" : "descending") : "none"}>
      <button type="button" class="sort" onClick={() => props.onSort(key)} data-testid={`sort-${key}`}>
        {label}
        {sort === key ? (key === "name" ? " ▲" : " ▼") : ""}
      </button>
    </th>
  );

  const d = model.diff;
  const cells = (row: TableRow) =>
    d ? (
      <>
        <td class="num">
          {formatValue(row.totalL!, units)} <span class="muted">{formatPercent(row.totalL!, d.leftTicks)}</span>
        </td>
        <td class="num">
          {formatValue(row.totalR!, units)} <span class="muted">{formatPercent(row.totalR!, d.rightTicks)}</span>
        </td>
        <td class="num">
          {change(row, model) > 0 ? "+" : ""}
          {change(row, model).toFixed(2)} pp
        </td>
      </>
    ) : (
      <>
        <td class="num">
          {formatValue(row.self, units)} <span class="muted">{formatPercent(row.self, model.numTicks)}</span>
        </td>
        <td class="num">
          {formatValue(row.total, units)} <span class="muted">{formatPercent(row.total, model.numTicks)}</span>
        </td>
      </>
    );
  return (
    <div class="table-wrap">
      <table class="top-table" data-testid="top-table">
        <thead>
          {d ? (
            <tr>
              {header("name", "Function")}
              {header("total", "Baseline total")}
              <th>Comparison total</th>
              {header("change", "Change of share")}
            </tr>
          ) : (
            <tr>
              {header("name", "Function")}
              {header("self", "Self")}
              {header("total", "Total")}
            </tr>
          )}
        </thead>
        <tbody>
          {rows.map((row) => (
            <tr key={row.name} onMouseEnter={() => props.onHover?.(row.name)} onMouseLeave={() => props.onHover?.(null)}>
              <td class="fn">
                <button
                  type="button"
                  class="link"
                  title={row.name}
                  onClick={() => props.onPick(row.name)}
                  onFocus={() => props.onHover?.(row.name)}
                  onBlur={() => props.onHover?.(null)}
                >
                  {row.name}
                </button>
                {props.actions?.(row.name)}
              </td>
              {cells(row)}
            </tr>
          ))}
          {matching > rows.length && (
            <tr>
              <td colSpan={d ? 4 : 3} class="muted">
                {matching - rows.length} more functions; search to find one.
              </td>
            </tr>
          )}
          {rows.length === 0 && (
            <tr>
              <td colSpan={d ? 4 : 3} class="muted">
                {search ? `No function matches “${search}”.` : "No functions."}
              </td>
            </tr>
          )}
        </tbody>
      </table>
    </div>
  );
}
