//! One chunk of a recording: its header, its constant pools (checkpoint events) and the events
//! that become profiles, counted per stack trace for each [`Kind`](super::Kind).

use std::collections::HashMap;

use super::metadata::{self, Types};
use super::reader::{JfrString, Reader};
use super::value::{Decoder, Value};
use super::{Counts, JfrError, Kind};

/// The chunk header's size: magic, version, six longs and the features int.
pub(crate) const HEADER_BYTES: usize = 68;

/// A resolved constant of one of the types stack traces need; others are not kept.
enum Constant {
    /// `java.lang.String`, or `jdk.types.Symbol`'s and `jdk.types.ThreadState`'s text.
    Text(JfrString),
    /// `java.lang.Class`: the key of its name's symbol.
    Class { name: u64 },
    /// `jdk.types.Method`: its class's key and its name's symbol key.
    Method { class: u64, name: u64 },
    /// `jdk.types.StackTrace`: method keys, leaf first.
    Stack(Vec<u64>),
}

/// The pools of one chunk: (type id, key) → constant.
#[derive(Default)]
struct Pools {
    constants: HashMap<(u64, u64), Constant>,
}

/// The type ids the conversion looks up, from the chunk's metadata.
struct Ids {
    string: Option<u64>,
    symbol: Option<u64>,
    class: Option<u64>,
    method: Option<u64>,
    stack: Option<u64>,
    state: Option<u64>,
}

/// Reads the chunk at the start of `r` (which holds the rest of the recording), adds its
/// events to `counts`, and returns the chunk's size.
pub(crate) fn read(
    r: &Reader<'_>,
    budget: &mut u64,
    limit: u64,
    counts: &mut Counts,
) -> Result<usize, JfrError> {
    let mut header = r.clone();
    let start = header.offset();
    if header.bytes(4)? != b"FLR\0" {
        return Err(JfrError::BadMagic { offset: start });
    }
    let major = header.fixed(2)?;
    let minor = header.fixed(2)?;
    if !(1..=2).contains(&major) {
        return Err(JfrError::UnsupportedVersion {
            offset: start,
            major,
            minor,
        });
    }
    let field = |h: &mut Reader<'_>, what: &'static str| -> Result<usize, JfrError> {
        let offset = h.offset();
        let value = h.fixed(8)?;
        usize::try_from(value).map_err(|_| JfrError::Invalid {
            what,
            offset,
            value,
        })
    };
    let size_offset = header.offset();
    let size = field(&mut header, "chunk size")?;
    let _pool_offset = field(&mut header, "constant pool offset")?;
    let meta_offset_at = header.offset();
    let meta_offset = field(&mut header, "metadata offset")?;
    header.fixed(8)?; // start nanos
    header.fixed(8)?; // duration nanos
    header.fixed(8)?; // start ticks
    let ticks_per_second = header.fixed(8)?;
    let features = header.fixed(4)?;
    if size < HEADER_BYTES || size > header.remaining() + HEADER_BYTES {
        return Err(JfrError::Invalid {
            what: "chunk size",
            offset: size_offset,
            value: size as u64,
        });
    }
    let compressed = features & 1 != 0;
    let mut chunk = r.clone();
    let mut chunk = Reader::new(chunk.bytes(size)?, start, compressed);
    if meta_offset < HEADER_BYTES || meta_offset >= size {
        return Err(JfrError::Invalid {
            what: "metadata offset",
            offset: meta_offset_at,
            value: meta_offset as u64,
        });
    }
    chunk.seek(meta_offset)?;
    let types = metadata::read(&mut chunk)?;
    let ids = Ids {
        string: types.id_of("java.lang.String"),
        symbol: types.id_of("jdk.types.Symbol"),
        class: types.id_of("java.lang.Class"),
        method: types.id_of("jdk.types.Method"),
        stack: types.id_of("jdk.types.StackTrace"),
        state: types.id_of("jdk.types.ThreadState"),
    };
    let kinds: HashMap<u64, Kind> = types
        .classes
        .iter()
        .filter_map(|(&id, class)| Kind::of_event(types.name(class.name)).map(|k| (id, k)))
        .collect();
    let mut decoder = Decoder {
        types: &types,
        budget,
        limit,
    };
    // One pass: constant pools are gathered while events are counted by stack-trace key, and
    // the keys are resolved once the whole chunk is read, so the order of checkpoints and
    // events in the chunk does not matter.
    let mut pools = Pools::default();
    let mut events: Vec<Event> = Vec::new();
    let mut settings: Vec<(JfrString, JfrString)> = Vec::new();
    chunk.seek(HEADER_BYTES)?;
    while chunk.remaining() > 0 {
        let event_start = chunk.offset();
        let event_size = chunk.count("event size")?;
        let header_len = chunk.offset() - event_start;
        let body_len = event_size
            .checked_sub(header_len)
            .filter(|_| event_size > 0);
        let Some(body_len) = body_len else {
            return Err(JfrError::Invalid {
                what: "event size",
                offset: event_start,
                value: event_size as u64,
            });
        };
        let mut event = chunk.sub(body_len)?;
        let type_id = event.long()?;
        match type_id {
            0 => {} // metadata, read above from the header's offset
            1 => checkpoint(&mut decoder, &mut event, &ids, &mut pools)?,
            _ => {
                let Some(&kind) = kinds.get(&type_id) else {
                    continue;
                };
                let value = decoder.value(&mut event, type_id, 2, 0)?;
                let Some(class) = types.classes.get(&type_id) else {
                    continue;
                };
                let get = |name: &str| match (&value, types.field(class, name)) {
                    (Value::Object(fields), Some(i)) => fields.get(i),
                    _ => None,
                };
                if kind == Kind::Setting {
                    let text = |v: Option<&Value>| match v {
                        Some(Value::Str(s)) => Some(s.clone()),
                        _ => None,
                    };
                    if let (Some(name), Some(value)) = (text(get("name")), text(get("value"))) {
                        settings.push((name, value));
                    }
                    continue;
                }
                let Some(stack) = get("stackTrace").and_then(Value::as_u64) else {
                    continue;
                };
                let amount = match kind {
                    Kind::InNewTlab => get("tlabSize").and_then(Value::as_u64).unwrap_or(0),
                    Kind::OutsideTlab => get("allocationSize").and_then(Value::as_u64).unwrap_or(0),
                    // Durations are in ticks; the series is in nanoseconds.
                    Kind::Lock => ticks_to_nanos(
                        get("duration").and_then(Value::as_u64).unwrap_or(0),
                        ticks_per_second,
                    ),
                    _ => 1,
                };
                let state = get("state").and_then(Value::as_u64);
                events.push(Event {
                    kind,
                    stack,
                    amount,
                    state,
                });
            }
        }
    }
    resolve(&pools, &ids, &events, &settings, counts);
    Ok(size)
}

/// One event that becomes part of a profile, before its keys are resolved.
struct Event {
    kind: Kind,
    /// The stack trace's key.
    stack: u64,
    /// Bytes or nanoseconds, per `kind`; 1 for samples.
    amount: u64,
    /// The thread state's key, for execution samples.
    state: Option<u64>,
}

/// `ticks` at `per_second` ticks a second, in nanoseconds (saturating; a zero rate reads as
/// nanoseconds).
fn ticks_to_nanos(ticks: u64, per_second: u64) -> u64 {
    if per_second == 0 || per_second == 1_000_000_000 {
        return ticks;
    }
    let nanos = u128::from(ticks) * 1_000_000_000 / u128::from(per_second);
    u64::try_from(nanos).unwrap_or(u64::MAX)
}

/// Reads one checkpoint event's pools, keeping the constants stack traces need.
fn checkpoint(
    decoder: &mut Decoder<'_>,
    r: &mut Reader<'_>,
    ids: &Ids,
    pools: &mut Pools,
) -> Result<(), JfrError> {
    r.long()?; // start time
    r.long()?; // duration
    r.long()?; // delta to the previous checkpoint
    r.u8()?; // type mask (flush, chunk header, statics, thread)
    let pool_count = r.bounded_count("constant pool count")?;
    for _ in 0..pool_count {
        let type_id = r.long()?;
        let count = r.bounded_count("constant count")?;
        let wanted = [
            ids.string, ids.symbol, ids.class, ids.method, ids.stack, ids.state,
        ]
        .contains(&Some(type_id));
        for _ in 0..count {
            let key = r.long()?;
            let value = decoder.value(r, type_id, if wanted { 3 } else { 0 }, 0)?;
            if wanted && let Some(constant) = constant(decoder.types, ids, type_id, value) {
                pools.constants.insert((type_id, key), constant);
            }
        }
    }
    Ok(())
}

/// The constant a decoded pool entry of `type_id` stands for.
fn constant(types: &Types, ids: &Ids, type_id: u64, value: Value) -> Option<Constant> {
    let class = types.classes.get(&type_id)?;
    let fields = match value {
        Value::Str(s) => return Some(Constant::Text(s)),
        Value::Object(fields) => fields,
        _ => return None,
    };
    let get = |name: &str| types.field(class, name).and_then(|i| fields.get(i));
    let key = |name: &str| get(name).and_then(Value::as_u64);
    let id = Some(type_id);
    if id == ids.symbol || id == ids.state {
        let field = if id == ids.symbol { "string" } else { "name" };
        match get(field) {
            Some(Value::Str(s)) => Some(Constant::Text(s.clone())),
            _ => None,
        }
    } else if id == ids.class {
        Some(Constant::Class { name: key("name")? })
    } else if id == ids.method {
        Some(Constant::Method {
            class: key("type")?,
            name: key("name")?,
        })
    } else if id == ids.stack {
        let frame_class = class
            .fields
            .get(types.field(class, "frames")?)
            .and_then(|f| types.classes.get(&f.type_id))?;
        let method = types.field(frame_class, "method")?;
        let Some(Value::Array(frames)) = get("frames") else {
            return None;
        };
        Some(Constant::Stack(
            frames
                .iter()
                .filter_map(|frame| match frame {
                    Value::Object(f) => f.get(method).and_then(Value::as_u64),
                    _ => None,
                })
                .collect(),
        ))
    } else {
        None
    }
}

/// Resolves the chunk's events to frame names and adds them to `counts`, and records
/// async-profiler's `event` setting (which names the CPU series).
fn resolve(
    pools: &Pools,
    ids: &Ids,
    events: &[Event],
    settings: &[(JfrString, JfrString)],
    counts: &mut Counts,
) {
    let string = |s: &'_ JfrString| -> Option<String> {
        match s {
            JfrString::Text(s) => Some(s.clone()),
            JfrString::Pooled(k) => match pools.constants.get(&(ids.string?, *k))? {
                Constant::Text(JfrString::Text(s)) => Some(s.clone()),
                _ => None,
            },
            JfrString::Null => None,
        }
    };
    for (name, value) in settings {
        if string(name).as_deref() == Some("event") {
            counts.event = string(value);
        }
    }
    let text = |type_id: Option<u64>, key: u64| -> Option<&str> {
        let found = match pools.constants.get(&(type_id?, key))? {
            Constant::Text(JfrString::Pooled(k)) => pools.constants.get(&(ids.string?, *k))?,
            other => other,
        };
        match found {
            Constant::Text(JfrString::Text(s)) => Some(s.as_str()),
            _ => None,
        }
    };
    let frame_name = |method: u64| -> Option<String> {
        let Constant::Method { class, name } = pools.constants.get(&(ids.method?, method))? else {
            return None;
        };
        let Constant::Class { name: class_name } = pools.constants.get(&(ids.class?, *class))?
        else {
            return None;
        };
        // Pyroscope's frame name: the binary class name with dots, a dot, the method name.
        let class_name = text(ids.symbol, *class_name)?.replace('/', ".");
        Some(format!("{class_name}.{}", text(ids.symbol, *name)?))
    };
    // Events are summed per (kind, stack, sleeping) first, so that each distinct stack is
    // named and inserted once.
    let mut sums: HashMap<(Kind, u64, bool), (u64, u64)> = HashMap::new();
    for event in events {
        let sleeping = event
            .state
            .and_then(|s| text(ids.state, s))
            .is_some_and(|s| s == "STATE_SLEEPING");
        let sum = sums.entry((event.kind, event.stack, sleeping)).or_default();
        sum.0 += 1;
        sum.1 = sum.1.saturating_add(event.amount);
    }
    let mut stacks: HashMap<u64, Option<Vec<String>>> = HashMap::new();
    for ((kind, stack, sleeping), (events, amount)) in sums {
        let names = stacks.entry(stack).or_insert_with(|| {
            let Some(Constant::Stack(methods)) =
                ids.stack.and_then(|t| pools.constants.get(&(t, stack)))
            else {
                return None;
            };
            // Frames the pools cannot name are left out, as Pyroscope does; stacks are stored
            // root first, JFR writes them leaf first.
            Some(
                methods
                    .iter()
                    .rev()
                    .filter_map(|&m| frame_name(m))
                    .collect(),
            )
        });
        let Some(names) = names else {
            counts.unresolved += events;
            continue;
        };
        counts.add(kind, names, events, amount, sleeping);
    }
}
