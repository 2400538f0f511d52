//! Core lists: `0,2-3`, `[0,2-3]`, or a hex mask `0x5`.

use super::ParseError;

/// The largest core number accepted in a core list.
pub const MAX_CORE: usize = 4095;

/// The cores this process may run on (its CPU affinity), sorted; `None` when the affinity
/// cannot be read.
pub fn available_cores() -> Option<Vec<usize>> {
    let mut v: Vec<usize> = core_affinity::get_core_ids()?
        .into_iter()
        .map(|c| c.id)
        .collect();
    v.sort_unstable();
    Some(v)
}

/// A sorted core list as text, runs as ranges: `0-3,6`.
pub fn core_list_text(cores: &[usize]) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut i = 0;
    while i < cores.len() {
        let mut j = i;
        while j + 1 < cores.len() && cores[j + 1] == cores[j] + 1 {
            j += 1;
        }
        out.push(if i == j {
            cores[i].to_string()
        } else {
            format!("{}-{}", cores[i], cores[j])
        });
        i = j + 1;
    }
    out.join(",")
}

/// Parses a core list (`0,2-3`, `[0,2-3]`) or a hex mask (`0x5`: cores 0 and 2).
/// Returns the cores sorted, without duplicates; never empty.
pub fn parse_cores(input: &str) -> Result<Vec<usize>, ParseError> {
    let err = |why: String| ParseError::Cores {
        input: input.to_string(),
        why,
    };
    let s = input.trim();
    if let Some(hex) = s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        return mask(hex).map_err(err);
    }
    let s = match (s.strip_prefix('['), s.ends_with(']')) {
        (Some(inner), true) => &inner[..inner.len() - 1],
        (None, false) => s,
        _ => return Err(err("unbalanced brackets".into())),
    };
    let num = |t: &str| -> Result<usize, ParseError> {
        let t = t.trim();
        if t.is_empty() || !t.bytes().all(|b| b.is_ascii_digit()) {
            return Err(err(format!("'{t}' is not a core number")));
        }
        match t.parse::<usize>() {
            Ok(n) if n <= MAX_CORE => Ok(n),
            _ => Err(err(format!("core {t} is above {MAX_CORE}"))),
        }
    };
    let mut cores = Vec::new();
    for item in s.split(',') {
        if item.trim().is_empty() {
            return Err(err("an item of the list is empty".into()));
        }
        match item.split_once('-') {
            Some((a, b)) => {
                let (a, b) = (num(a)?, num(b)?);
                if a > b {
                    return Err(err(format!("the range {a}-{b} runs backwards")));
                }
                cores.extend(a..=b);
            }
            None => cores.push(num(item)?),
        }
    }
    cores.sort_unstable();
    cores.dedup();
    Ok(cores)
}

/// The cores of a hex mask (the digits after `0x`).
fn mask(hex: &str) -> Result<Vec<usize>, String> {
    if hex.is_empty() || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err("the mask is not hexadecimal".into());
    }
    let digits = hex.trim_start_matches('0');
    if digits.len() * 4 > MAX_CORE + 1 {
        return Err(format!("the mask names cores above {MAX_CORE}"));
    }
    let mut cores = Vec::new();
    // Nibbles from the least significant end: nibble i covers cores 4i..4i+3.
    for (i, c) in digits.bytes().rev().enumerate() {
        let v = (c as char).to_digit(16).unwrap_or(0);
        for bit in 0..4 {
            if v & (1 << bit) != 0 {
                cores.push(i * 4 + bit);
            }
        }
    }
    if cores.is_empty() {
        return Err("the mask selects no core".into());
    }
    Ok(cores)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cores() {
        assert_eq!(parse_cores("0"), Ok(vec![0]));
        assert_eq!(parse_cores("0,2-3"), Ok(vec![0, 2, 3]));
        assert_eq!(parse_cores(" 0, 2 - 3 "), Ok(vec![0, 2, 3]));
        assert_eq!(parse_cores("[0,2-3]"), Ok(vec![0, 2, 3]));
        assert_eq!(parse_cores("3,1,1,2"), Ok(vec![1, 2, 3]));
        assert_eq!(parse_cores("0x5"), Ok(vec![0, 2]));
        assert_eq!(parse_cores("0X30"), Ok(vec![4, 5]));
        assert_eq!(parse_cores("0x0001"), Ok(vec![0]));
        for s in [
            "", "0x", "0x0", "0xg", "a", "1-", "-1", "3-1", "1,,2", "[0", "0]", "4096", "0,x",
        ] {
            let e = parse_cores(s).unwrap_err().to_string();
            assert!(e.contains("expected a list of cores"), "{s}: {e}");
        }
        let big = format!("0x1{}", "0".repeat(1024));
        assert!(parse_cores(&big).is_err());
        assert_eq!(
            parse_cores(&format!("0x1{}", "0".repeat(1023))),
            Ok(vec![4092])
        );
    }
}
