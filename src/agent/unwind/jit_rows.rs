//! A JIT method's rules as [`UnwindRow`]s: its `.eh_frame` is evaluated
//! once, when the method is published, into rows by code offset, kept in its
//! code header. The agent's handler binary-searches them, and so does the
//! eBPF profiler's kernel-side walk, which cannot evaluate DWARF (it finds
//! them through the descriptor).

use super::modules::evaluate;
use super::rule::{Base, Saved};
use super::{Rule, StackEnd};
use crate::remote::UnwindRow;

/// The rule at code offset `offset` of a method with `rows`: `None` where no
/// row gives one (no rows, before the first, or a gap between FDEs), and the
/// frame steps by the frame-pointer convention.
pub(crate) fn rule_at(rows: &[UnwindRow], offset: usize) -> Option<Result<Rule, StackEnd>> {
    let i = rows.partition_point(|r| r.offset as usize <= offset);
    let row = rows.get(i.checked_sub(1)?)?;
    match row.kind {
        UnwindRow::RULE => Some(Ok(Rule {
            base: if row.base == UnwindRow::BASE_FP {
                Base::Fp
            } else {
                Base::Sp
            },
            offset: row.cfa,
            ra: (row.has_ra != 0).then_some(i32::from(row.ra)),
            fp: match row.fp_rule {
                UnwindRow::FP_SAME => Saved::Same,
                UnwindRow::FP_AT => Saved::At(i32::from(row.fp)),
                _ => Saved::Lost,
            },
        })),
        UnwindRow::NONE => None,
        _ => Some(Err(StackEnd::Unsupported)),
    }
}

/// The rows of `frame`, a method's `.eh_frame` (built for its code's
/// address), for its code of `size` bytes at `start`: those of FDEs inside
/// the code, by offset from `start`. Empty when no FDE covers the code (the
/// method then steps by the frame-pointer convention).
pub(crate) fn rows(frame: &[u8], start: usize, size: u64) -> Box<[UnwindRow]> {
    let end = start.saturating_add(size as usize);
    let mut out: Vec<UnwindRow> = evaluate(frame, frame.as_ptr() as usize)
        .into_iter()
        .filter(|r| (start..end).contains(&r.addr))
        .map(|r| row((r.addr - start) as u32, r.rule))
        .collect();
    // Rows that differ only in what the conversion drops merge.
    out.dedup_by(|next, prev| {
        UnwindRow {
            offset: prev.offset,
            ..*next
        } == *prev
    });
    out.into_boxed_slice()
}

/// The row at `offset` for `rule`.
fn row(offset: u32, rule: Result<Rule, StackEnd>) -> UnwindRow {
    let unsupported = UnwindRow {
        offset,
        kind: UnwindRow::UNSUPPORTED,
        ..UnwindRow::default()
    };
    let rule = match rule {
        Ok(rule) => rule,
        Err(StackEnd::NoUnwindInfo) => {
            return UnwindRow {
                offset,
                kind: UnwindRow::NONE,
                ..UnwindRow::default()
            };
        }
        Err(_) => return unsupported,
    };
    let (fp_rule, fp) = match rule.fp {
        Saved::Same => (UnwindRow::FP_SAME, Some(0)),
        Saved::At(n) => (UnwindRow::FP_AT, i16::try_from(n).ok()),
        Saved::Lost => (UnwindRow::FP_LOST, Some(0)),
    };
    let ra = rule.ra.map_or(Some(0), |n| i16::try_from(n).ok());
    let (Some(fp), Some(ra)) = (fp, ra) else {
        // A saved word farther than 32 KiB from the CFA.
        return unsupported;
    };
    UnwindRow {
        offset,
        cfa: rule.offset,
        ra,
        fp,
        kind: UnwindRow::RULE,
        base: match rule.base {
            Base::Sp => UnwindRow::BASE_SP,
            Base::Fp => UnwindRow::BASE_FP,
        },
        fp_rule,
        has_ra: u8::from(rule.ra.is_some()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rule_survives_its_row_and_offsets_find_their_row() {
        let rules = [
            (0, Ok(Rule::AT_ENTRY)),
            (1, Ok(Rule::AFTER_PUSH)),
            (4, Ok(Rule::FRAME_POINTER)),
            (17, Err(StackEnd::NoUnwindInfo)),
            (20, Err(StackEnd::Unsupported)),
        ];
        let rows: Vec<UnwindRow> = rules.iter().map(|&(at, rule)| row(at, rule)).collect();
        let expect = |offset| match offset {
            0 => Some(Ok(Rule::AT_ENTRY)),
            1..=3 => Some(Ok(Rule::AFTER_PUSH)),
            4..=16 => Some(Ok(Rule::FRAME_POINTER)),
            17..=19 => None,
            _ => Some(Err(StackEnd::Unsupported)),
        };
        for offset in 0..40 {
            assert_eq!(rule_at(&rows, offset), expect(offset), "{offset}");
        }
        // Before the first row, and without rows: no rule.
        assert_eq!(rule_at(&rows[2..], 3), None);
        assert_eq!(rule_at(&[], 3), None);
    }

    #[test]
    fn each_rule_becomes_its_row() {
        assert_eq!(
            row(4, Ok(Rule::FRAME_POINTER)),
            UnwindRow {
                offset: 4,
                cfa: 16,
                ra: -8,
                fp: -16,
                kind: UnwindRow::RULE,
                base: UnwindRow::BASE_FP,
                fp_rule: UnwindRow::FP_AT,
                has_ra: 1,
            }
        );
        let outermost = Rule {
            ra: None,
            fp: Saved::Lost,
            ..Rule::AT_ENTRY
        };
        assert_eq!(
            row(0, Ok(outermost)),
            UnwindRow {
                offset: 0,
                cfa: 8,
                kind: UnwindRow::RULE,
                base: UnwindRow::BASE_SP,
                fp_rule: UnwindRow::FP_LOST,
                ..UnwindRow::default()
            }
        );
        assert_eq!(row(9, Err(StackEnd::NoUnwindInfo)).kind, UnwindRow::NONE);
        assert_eq!(
            row(9, Err(StackEnd::Unsupported)).kind,
            UnwindRow::UNSUPPORTED
        );
        let far = Rule {
            fp: Saved::At(-40_000),
            ..Rule::FRAME_POINTER
        };
        assert_eq!(
            row(2, Ok(far)),
            UnwindRow {
                offset: 2,
                kind: UnwindRow::UNSUPPORTED,
                ..UnwindRow::default()
            }
        );
    }
}
