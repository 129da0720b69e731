//! Range-map insert, remove and find against a `BTreeMap` model.
#![no_main]

use std::collections::BTreeMap;

use arbitrary::Arbitrary;
use jitmap::Domain;
use jitmap::range::{RangeError, RangeSectionMap};
use libfuzzer_sys::fuzz_target;

#[derive(Arbitrary, Debug)]
enum Op {
    Insert { begin: u32, len: u32, high: u8 },
    Remove { index: u8 },
    RemoveAt { begin: u32, high: u8 },
    Find { addr: u32, high: u8 },
}

/// Spreads addresses over the 57-bit space (and just past it) while keeping
/// collisions likely.
fn addr(low: u32, high: u8) -> usize {
    (usize::from(high % 8) << 54) | ((low as usize) << 9)
}

fuzz_target!(|ops: Vec<Op>| {
    let domain = Domain::new(1);
    let map = RangeSectionMap::new(&domain);
    let reader = domain.register().unwrap();
    let mut model: BTreeMap<usize, (usize, u64)> = BTreeMap::new();
    for (step, op) in ops.iter().take(300).enumerate() {
        match *op {
            Op::Insert { begin, len, high } => {
                let begin = addr(begin, high);
                let end = begin.saturating_add((len as usize % (1 << 24)) << 3);
                let result = map.insert(begin, end, step as u64);
                let overlap = model
                    .range(..end)
                    .next_back()
                    .filter(|(_, (e, _))| *e > begin)
                    .map(|(&b, _)| b);
                let expected = if begin >= end {
                    Err(RangeError::Empty { begin, end })
                } else if (end - 1) >> 57 != 0 {
                    Err(RangeError::OutOfRange { begin, end })
                } else if let Some(existing) = overlap {
                    Err(RangeError::Overlap { begin, existing })
                } else {
                    Ok(())
                };
                assert_eq!(result, expected);
                if result.is_ok() {
                    model.insert(begin, (end, step as u64));
                }
            }
            Op::Remove { index } if !model.is_empty() => {
                let begin = *model.keys().nth(usize::from(index) % model.len()).unwrap();
                model.remove(&begin);
                map.remove(begin).unwrap();
            }
            Op::RemoveAt { begin, high } => {
                let begin = addr(begin, high);
                let expected = if model.remove(&begin).is_some() {
                    Ok(())
                } else {
                    Err(RangeError::NotFound { begin })
                };
                assert_eq!(map.remove(begin), expected);
            }
            Op::Find { addr: a, high } => {
                let a = addr(a, high) + (a as usize & 0x1FF);
                let guard = reader.pin().unwrap();
                let expected = model
                    .range(..=a)
                    .next_back()
                    .filter(|(_, (e, _))| a < *e)
                    .map(|(&b, &(e, v))| (b, e, v));
                assert_eq!(
                    map.find(&guard, a)
                        .unwrap()
                        .map(|s| (s.begin(), s.end(), *s.value())),
                    expected
                );
            }
            _ => {}
        }
    }
    assert_eq!(map.len(), model.len());
});
