//! The fidelity report: each conformance scenario's observations as one JSON line that holds
//! nothing provider- or run-dependent, and the comparison of two such reports.

use std::collections::BTreeMap;

use corelink_tests::record::Observation;
use serde::{Deserialize, Serialize};

/// One completion as the report shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CompletionRow {
    /// `IBV_WC_*` status name.
    pub status: String,
    /// `IBV_WC_*` opcode name.
    pub opcode: String,
    /// Bytes.
    pub byte_len: u32,
    /// Immediate, if any.
    pub imm: Option<u32>,
}

/// One scenario's line of the report.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Row {
    /// Scenario (conformance case) name.
    pub scenario: String,
    /// Why the provider cannot run it, instead of the observations.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub unsupported: Option<String>,
    /// `pass` or `fail` (a failure's message goes to standard error).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub result: Option<String>,
    /// Completions in the order polled.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub completions: Option<Vec<CompletionRow>>,
    /// Old values returned by atomics.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub atomic_values: Option<Vec<u64>>,
    /// Bytes of registered memory read back after the operations.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub memory_bytes: Option<u64>,
    /// FNV-1a of those bytes, hex.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub memory_fnv1a: Option<String>,
}

impl Row {
    /// The row of scenario `name`, which ended with `passed` and observed `o`.
    pub fn new(name: &str, passed: bool, o: &Observation) -> Row {
        if let Some(why) = &o.unsupported {
            return Row {
                scenario: name.to_owned(),
                unsupported: Some(why.clone()),
                result: None,
                completions: None,
                atomic_values: None,
                memory_bytes: None,
                memory_fnv1a: None,
            };
        }
        let completions = o
            .completions
            .iter()
            .map(|wc| CompletionRow {
                status: wc.status.name().to_owned(),
                opcode: wc.opcode.name().to_owned(),
                byte_len: wc.byte_len,
                imm: wc.imm,
            })
            .collect();
        Row {
            scenario: name.to_owned(),
            unsupported: None,
            result: Some(if passed { "pass" } else { "fail" }.to_owned()),
            completions: Some(completions),
            atomic_values: Some(o.atomic_values.clone()),
            memory_bytes: Some(o.memory_bytes),
            memory_fnv1a: Some(format!("{:016x}", o.memory_fnv1a)),
        }
    }

    /// The row as one line of JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
    }

    /// A one-line human summary.
    pub fn summary(&self) -> String {
        if let Some(why) = &self.unsupported {
            return format!("{:<36} unsupported: {why}", self.scenario);
        }
        let wcs: Vec<String> = self
            .completions
            .iter()
            .flatten()
            .map(|c| {
                let imm = c.imm.map(|i| format!(" imm={i:#x}")).unwrap_or_default();
                format!(
                    "{}/{}/{}{imm}",
                    c.status.trim_start_matches("IBV_WC_"),
                    c.opcode.trim_start_matches("IBV_WC_"),
                    c.byte_len
                )
            })
            .collect();
        format!(
            "{:<36} {:<4} {}",
            self.scenario,
            self.result.as_deref().unwrap_or("?"),
            wcs.join(" ")
        )
    }
}

/// The outcome of comparing two reports.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Comparison {
    /// Scenarios identical on both sides.
    pub identical: usize,
    /// Scenarios unsupported on either side: (scenario, side, reason).
    pub unsupported: Vec<(String, &'static str, String)>,
    /// Scenarios that differ: (scenario, left line, right line), a line being `None` when the
    /// scenario is missing on that side.
    pub differ: Vec<(String, Option<String>, Option<String>)>,
}

fn parse(report: &str) -> Result<BTreeMap<String, (Row, String)>, String> {
    let mut out = BTreeMap::new();
    for (i, line) in report.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
        let row: Row =
            serde_json::from_str(line).map_err(|e| format!("line {}: {e}: {line}", i + 1))?;
        out.insert(row.scenario.clone(), (row, line.to_owned()));
    }
    Ok(out)
}

/// Compares report `left` with report `right` (JSON lines), scenario by scenario.
pub fn compare(left: &str, right: &str) -> Result<Comparison, String> {
    let (l, r) = (parse(left)?, parse(right)?);
    let mut c = Comparison::default();
    let names: std::collections::BTreeSet<&String> = l.keys().chain(r.keys()).collect();
    for name in names {
        match (l.get(name), r.get(name)) {
            (Some((a, _)), _) if a.unsupported.is_some() => c.unsupported.push((
                name.clone(),
                "left",
                a.unsupported.clone().unwrap_or_default(),
            )),
            (_, Some((b, _))) if b.unsupported.is_some() => c.unsupported.push((
                name.clone(),
                "right",
                b.unsupported.clone().unwrap_or_default(),
            )),
            (Some((a, la)), Some((b, lb))) => {
                if a == b {
                    c.identical += 1;
                } else {
                    c.differ.push((name.clone(), Some(la.clone()), Some(lb.clone())));
                }
            }
            (a, b) => c.differ.push((name.clone(), a.map(|x| x.1.clone()), b.map(|x| x.1.clone()))),
        }
    }
    Ok(c)
}

#[cfg(test)]
mod tests {
    use super::*;
    use corelink_verbs::{Wc, WcOpcode, WcStatus};

    fn obs(status: WcStatus) -> Observation {
        Observation {
            completions: vec![Wc {
                status,
                opcode: WcOpcode::RdmaWrite,
                byte_len: 8,
                ..Wc::default()
            }],
            memory_fnv1a: 1,
            memory_bytes: 8,
            atomic_values: vec![],
            unsupported: None,
        }
    }

    #[test]
    fn rows_round_trip_and_compare() {
        let a = Row::new("rc_write", true, &obs(WcStatus::Success)).to_json();
        assert!(a.starts_with("{\"scenario\":\"rc_write\""), "{a}");
        assert!(a.contains("IBV_WC_RDMA_WRITE") && !a.contains("qp"), "{a}");
        let b = Row::new("rc_write", true, &obs(WcStatus::RemAccessErr)).to_json();
        let u = Observation { unsupported: Some("no".into()), ..Default::default() };
        let u = Row::new("mw", true, &u).to_json();
        let c = compare(&format!("{a}\n{u}\n"), &format!("{a}\n")).unwrap();
        assert_eq!(c.identical, 1);
        assert_eq!(c.unsupported.len(), 1);
        assert!(c.differ.is_empty());
        let c = compare(&a, &b).unwrap();
        assert_eq!(c.differ.len(), 1);
        let c = compare(&a, "").unwrap();
        assert_eq!(c.differ, vec![("rc_write".into(), Some(a.clone()), None)]);
        assert!(compare("not json", "").is_err());
    }
}
