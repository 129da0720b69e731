//! Arbitrary function tables through image registration: a typed error, or
//! lookups that agree with a linear-scan model at every offset.
#![no_main]

use arbitrary::Arbitrary;
use jitmap::image::{HotCold, ImageFunction, ImageInfo, ImageMethod, ImageSection};
use libfuzzer_sys::fuzz_target;

#[derive(Arbitrary, Debug)]
struct Input {
    /// Raw values as given, or a table built to be mostly valid.
    raw: bool,
    size: u16,
    /// `(gap or begin, length)` per function.
    functions: Vec<(u16, u8)>,
    /// Entry offsets (raw) or function indexes (built).
    entries: Vec<u16>,
    /// `(cold, hot)` function indexes.
    hot_cold: Vec<(u8, u8)>,
    thunks: Option<(u16, u8)>,
}

fuzz_target!(|input: Input| {
    let mut end = 0u32;
    let functions: Vec<ImageFunction> = input
        .functions
        .iter()
        .take(64)
        .map(|&(b, l)| {
            let begin = if input.raw {
                u32::from(b)
            } else {
                end + u32::from(b % 64)
            };
            end = begin + u32::from(l);
            ImageFunction {
                begin,
                end,
                unwind: Box::new([]),
            }
        })
        .collect();
    let entry = |e: u16| match (input.raw, functions.len()) {
        (false, n) if n > 0 => functions[usize::from(e) % n].begin,
        _ => u32::from(e),
    };
    let info = ImageInfo {
        base: 0x4000_0000,
        size: if input.raw {
            usize::from(input.size)
        } else {
            end as usize + usize::from(input.size % 256)
        },
        methods: input
            .entries
            .iter()
            .take(64)
            .enumerate()
            .map(|(i, &e)| ImageMethod {
                entry: entry(e),
                method_id: i as u64,
                gc: None,
                debug: vec![],
                name: String::new(),
            })
            .collect(),
        functions,
        hot_cold: input
            .hot_cold
            .iter()
            .take(16)
            .map(|&(c, h)| HotCold {
                cold: u32::from(c),
                hot: u32::from(h),
            })
            .collect(),
        thunks: input
            .thunks
            .map(|(s, l)| u32::from(s)..u32::from(s) + u32::from(l)),
    };
    let Ok(image) = ImageSection::new(info.clone()) else {
        return;
    };
    for rel in 0..=info.size as u64 {
        let got = image
            .lookup(rel)
            .map(|h| (h.method, h.function, h.offset, h.cold));
        assert_eq!(got, linear(&info, rel), "rel {rel:#x}");
    }
});

/// The same answers by linear scans: the function containing `rel`; for a cold
/// fragment, the pair whose cold range holds it; otherwise the nearest method
/// entry at or before it.
fn linear(info: &ImageInfo, rel: u64) -> Option<(usize, usize, u64, bool)> {
    if info
        .thunks
        .as_ref()
        .is_some_and(|t| rel >= u64::from(t.start) && rel < u64::from(t.end))
    {
        return None;
    }
    let f = &info.functions;
    let function = f
        .iter()
        .position(|x| u64::from(x.begin) <= rel && rel < u64::from(x.end))?;
    let entry_at = |i: usize| info.methods.iter().position(|m| m.entry == f[i].begin);
    let first_cold = info.hot_cold.first().map_or(f.len(), |p| p.cold as usize);
    let hot_len = |main: usize| -> u64 {
        let mut total = 0;
        for (i, x) in f.iter().enumerate().take(first_cold).skip(main) {
            if i > main && entry_at(i).is_some() {
                break;
            }
            total += u64::from(x.end - x.begin);
        }
        total
    };
    if function >= first_cold {
        let pair = info
            .hot_cold
            .iter()
            .rev()
            .find(|p| p.cold as usize <= function)?;
        let main = pair.hot as usize;
        let offset = hot_len(main) + rel - u64::from(f[pair.cold as usize].begin);
        return Some((entry_at(main)?, function, offset, true));
    }
    let main = (0..=function).rev().find(|&i| entry_at(i).is_some())?;
    Some((
        entry_at(main)?,
        function,
        rel - u64::from(f[main].begin),
        false,
    ))
}
