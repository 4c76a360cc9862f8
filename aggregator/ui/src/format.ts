// How values read to a person: CPU samples as seconds, bytes in binary multiples, counts with
// thousands separators, and times as local dates.

export interface Units {
  units: string;
  sampleRate: number;
}

const BYTES = ["B", "KiB", "MiB", "GiB", "TiB"];

/** A value in the profile's units, as a person reads it. */
export function formatValue(value: number, u: Units): string {
  switch (u.units) {
    case "samples":
      if (u.sampleRate > 0) return formatSeconds(value / u.sampleRate);
      return `${formatCount(value)} samples`;
    case "bytes": {
      let v = value;
      let i = 0;
      while (Math.abs(v) >= 1024 && i < BYTES.length - 1) {
        v /= 1024;
        i++;
      }
      return `${i === 0 ? v : v.toFixed(2)} ${BYTES[i]}`;
    }
    case "lock_nanoseconds":
    case "nanoseconds":
      return formatSeconds(value / 1e9);
    case "":
      return formatCount(value);
    default:
      return `${formatCount(value)} ${u.units.replace(/^lock_/, "")}`;
  }
}

export function formatSeconds(seconds: number): string {
  const abs = Math.abs(seconds);
  if (abs === 0) return "0 s";
  if (abs < 0.001) return `${(seconds * 1e6).toFixed(0)} µs`;
  if (abs < 1) return `${(seconds * 1000).toFixed(abs < 0.01 ? 2 : 1)} ms`;
  if (abs < 60) return `${seconds.toFixed(2)} s`;
  if (abs < 3600) return `${(seconds / 60).toFixed(1)} min`;
  return `${(seconds / 3600).toFixed(1)} h`;
}

export function formatCount(value: number): string {
  return Math.round(value).toLocaleString("en-US");
}

export function formatPercent(part: number, whole: number): string {
  if (whole <= 0) return "0%";
  const p = (part / whole) * 100;
  return `${p < 0.01 && p > 0 ? "<0.01" : p.toFixed(2)}%`;
}

/** A unix time (seconds) as `YYYY-MM-DD HH:MM:SS` in local time. */
export function formatTime(unix: number): string {
  const d = new Date(unix * 1000);
  const pad = (n: number) => String(n).padStart(2, "0");
  return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`;
}
