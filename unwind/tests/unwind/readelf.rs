//! Every row `readelf --debug-dump=frames-interp` prints for an executable is looked up in our
//! table at its address and must give the rule readelf's columns describe; the end of every FDE
//! that no other FDE continues must give "no FDE". readelf is binutils' own, independent DWARF
//! interpreter, so this checks the builder (gimli's row machine, our conversion, the compaction
//! and the page directory) against a second implementation on real Debian binaries.

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::process::Command;

use smolder_unwind::{Cfa, Fp, Rule, Unsupported};

use crate::util::table_of;

/// A row's CFA, rbp and return-address columns as readelf prints them.
type Columns = (String, String, String);

/// One FDE as readelf prints it.
struct Fde {
    start: u64,
    end: u64,
    signal: bool,
    /// `(address, CFA column, rbp column, ra column)`; empty when the FDE only inherits its
    /// CIE's initial row.
    rows: Vec<(u64, String, String, String)>,
    /// The CIE's initial row, for FDEs without rows of their own.
    initial: Option<Columns>,
}

fn readelf_fdes(path: &Path) -> Vec<Fde> {
    let output = Command::new("readelf")
        // -wN: do not follow debug links (readelf exits 1 when a linked file is missing).
        .args(["-wN", "--debug-dump=frames-interp"])
        .arg(path)
        .output()
        .expect("run readelf (apt-get install binutils)");
    assert!(
        output.status.success(),
        "readelf failed on {}",
        path.display()
    );
    let text = String::from_utf8(output.stdout).expect("readelf prints text");

    // CIE offset -> (signal augmentation, initial row)
    let mut cies: HashMap<String, (bool, Option<Columns>)> = HashMap::new();
    let mut fdes = Vec::new();
    // What the lines being read belong to: a CIE (its offset) or the last FDE.
    let mut current_cie: Option<String> = None;
    let mut columns: Vec<String> = Vec::new();
    for line in text.lines() {
        // A register rule prints as `r10 (r10)`: the parenthesised name joins its field.
        let mut fields: Vec<&str> = Vec::new();
        for field in line.split_whitespace() {
            if field.starts_with('(') && !fields.is_empty() {
                continue;
            }
            fields.push(field);
        }
        if fields.len() >= 5 && fields[3] == "CIE" {
            let signal = fields[4].trim_matches('"').contains('S');
            cies.insert(fields[0].to_owned(), (signal, None));
            current_cie = Some(fields[0].to_owned());
            continue;
        }
        if fields.len() >= 6 && fields[3] == "FDE" {
            let cie = fields[4].strip_prefix("cie=").expect("cie= field");
            let (signal, initial) = cies.get(cie).cloned().unwrap_or((false, None));
            let range = fields[5].strip_prefix("pc=").expect("pc= field");
            let (start, end) = range.split_once("..").expect("a range");
            fdes.push(Fde {
                start: u64::from_str_radix(start, 16).unwrap(),
                end: u64::from_str_radix(end, 16).unwrap(),
                signal,
                rows: Vec::new(),
                initial,
            });
            current_cie = None;
            continue;
        }
        if fields.first() == Some(&"LOC") {
            columns = fields.iter().map(|f| f.to_string()).collect();
            continue;
        }
        if fields.len() >= 2
            && fields[0].len() == 16
            && fields[0].chars().all(|c| c.is_ascii_hexdigit())
        {
            let column = |name: &str| {
                columns
                    .iter()
                    .position(|c| c == name)
                    .map_or("u".to_owned(), |i| fields[i].to_owned())
            };
            let row = (column("CFA"), column("rbp"), column("ra"));
            match &current_cie {
                Some(cie) => {
                    let entry = cies.get_mut(cie).expect("CIE seen");
                    entry.1.get_or_insert(row);
                }
                None => {
                    let fde = fdes.last_mut().expect("a row follows an FDE line");
                    let address = u64::from_str_radix(fields[0], 16).unwrap();
                    // advance_loc 0 repeats an address: the last row for it holds.
                    if fde.rows.last().is_some_and(|r| r.0 == address) {
                        fde.rows.pop();
                    }
                    fde.rows.push((address, row.0, row.1, row.2));
                }
            }
        }
    }
    fdes
}

/// Whether our rule is what readelf's columns describe.
fn agrees(rule: Rule, signal: bool, cfa: &str, rbp: &str, ra: &str) -> bool {
    if signal {
        return rule == Rule::Signal;
    }
    match ra {
        "u" => return rule == Rule::End,
        "c-8" => {}
        _ => return rule == Rule::Unsupported(Unsupported::ReturnAddress),
    }
    let fp = match rbp {
        "u" | "s" => Fp::Same,
        _ => match rbp
            .strip_prefix('c')
            .and_then(|off| off.parse::<i16>().ok())
        {
            Some(off) => Fp::AtCfa(off),
            None => Fp::Lost,
        },
    };
    if cfa == "exp" {
        return match rule {
            Rule::Frame {
                cfa: Cfa::Plt1 | Cfa::Plt2,
                fp: f,
            } => f == fp,
            Rule::Frame {
                cfa: Cfa::DerefRsp { .. },
                fp: Fp::Same,
            } => fp == Fp::Same,
            Rule::Unsupported(Unsupported::CfaExpression) => true,
            _ => false,
        };
    }
    let Some((register, offset)) = cfa.split_once('+') else {
        return false;
    };
    let Ok(offset) = offset.parse::<u64>() else {
        return false;
    };
    let expected = match register {
        "rsp" => u32::try_from(offset)
            .ok()
            .map(Cfa::Rsp)
            .filter(|cfa| cfa.fits()),
        "rbp" => u16::try_from(offset).ok().map(Cfa::Rbp),
        _ => return rule == Rule::Unsupported(Unsupported::CfaRegister),
    };
    match expected {
        Some(cfa) => rule == Rule::Frame { cfa, fp },
        None => rule == Rule::Unsupported(Unsupported::CfaOffset),
    }
}

/// Checks every readelf row of `path`; returns how many were checked.
fn check(path: &str) -> usize {
    let path = Path::new(path);
    let table = table_of(path);
    let fdes = readelf_fdes(path);
    assert!(
        !fdes.is_empty(),
        "readelf shows no FDE in {}",
        path.display()
    );
    let starts: HashSet<u64> = fdes
        .iter()
        .filter(|f| f.end > f.start)
        .map(|f| f.start)
        .collect();
    let mut checked = 0;
    let mut failures = Vec::new();
    for fde in fdes.iter().filter(|f| f.end > f.start) {
        let rows: Vec<(u64, String, String, String)> = if fde.rows.is_empty() {
            let (cfa, rbp, ra) = fde.initial.clone().expect("the CIE's initial row");
            vec![(fde.start, cfa, rbp, ra)]
        } else {
            fde.rows.clone()
        };
        for (address, cfa, rbp, ra) in rows {
            checked += 1;
            let rule = table.lookup(address);
            if !agrees(rule, fde.signal, &cfa, &rbp, &ra) {
                failures.push(format!(
                    "{address:#x}: ours {rule:?}, readelf {cfa} rbp={rbp} ra={ra}"
                ));
            }
        }
        if !starts.contains(&fde.end) && table.lookup(fde.end) != Rule::NoFde {
            failures.push(format!(
                "{:#x}: FDE end, ours {:?}",
                fde.end,
                table.lookup(fde.end)
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{}: {} of {checked} rows disagree with readelf, first: {:#?}",
        path.display(),
        failures.len(),
        &failures[..failures.len().min(10)]
    );
    let stats = table.stats();
    assert_eq!(stats.fdes_skipped, 0, "{}: {stats:?}", path.display());
    assert!(stats.rows <= stats.cfi_rows + stats.fdes, "{stats:?}");
    checked
}

#[test]
fn libc() {
    let checked = check("/usr/lib/x86_64-linux-gnu/libc.so.6");
    assert!(checked > 20_000, "{checked}");
    let table = table_of(Path::new("/usr/lib/x86_64-linux-gnu/libc.so.6"));
    let stats = table.stats();
    // __restore_rt; hand-written assembly keeping the return address in a register, counted,
    // not guessed.
    assert_eq!(stats.signal_fdes, 1, "{stats:?}");
    assert!(
        stats.unsupported(Unsupported::ReturnAddress) > 0,
        "{stats:?}"
    );
}

#[test]
fn ld_so() {
    check("/lib64/ld-linux-x86-64.so.2");
}

#[test]
fn python3_11() {
    let checked = check("/usr/bin/python3.11");
    assert!(checked > 50_000, "{checked}");
    let stats = table_of(Path::new("/usr/bin/python3.11")).stats().clone();
    assert_eq!(stats.unsupported, [0; 4], "{stats:?}");
}

#[test]
fn libstdcxx() {
    check("/usr/lib/x86_64-linux-gnu/libstdc++.so.6");
}

/// OpenSSL's hand-written assembly (perlasm): functions that keep their CFA in a register other
/// than `rsp` or `rbp` (the stack realigned, the old `rsp` in `r11` or `rax`: 729 rows of
/// Debian's 3.0) and CFA expressions that are neither PLT nor `*(rsp+a)+b` (62), which are
/// counted as unsupported rather than guessed; readelf agrees on every row.
#[test]
fn libcrypto() {
    let path = "/usr/lib/x86_64-linux-gnu/libcrypto.so.3";
    assert!(
        Path::new(path).exists(),
        "{path} is missing: apt-get install libssl3 (scripts/test installs it)"
    );
    let checked = check(path);
    assert!(checked > 50_000, "{checked}");
    let stats = table_of(Path::new(path)).stats().clone();
    assert!(
        stats.unsupported(Unsupported::CfaRegister) > 0
            && stats.unsupported(Unsupported::CfaExpression) > 0,
        "{stats:?}"
    );
}
