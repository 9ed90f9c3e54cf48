//! `submit --frame-files PATTERN`: which of a job's files belong to one
//! frame each (a simulation cache, an image sequence), so that a worker
//! fetches a frame's files for that frame's tasks only, instead of the
//! whole scene before its first task.
//!
//! A pattern is a path in the job folder with one run of `#` standing for
//! the frame number (at least as many digits as the run is long, as
//! Blender pads them) and `*` for any characters but `/`.

use anyhow::bail;

/// The most `--frame-files` patterns a submit takes, and their length.
const MAX_PATTERNS: usize = 64;
const MAX_PATTERN_LEN: usize = 1024;

#[derive(Debug, Clone, Copy, PartialEq)]
enum Token {
    Literal(char),
    /// Any characters but `/`, none included.
    Star,
    /// The frame number: at least this many digits.
    Frame(usize),
}

#[derive(Debug)]
pub struct Pattern {
    tokens: Vec<Token>,
}

impl Pattern {
    pub fn parse(text: &str) -> anyhow::Result<Pattern> {
        if text.is_empty() || text.len() > MAX_PATTERN_LEN {
            bail!("--frame-files takes a path of 1 to {MAX_PATTERN_LEN} bytes");
        }
        if text.starts_with('/') || text.split('/').any(|c| c == "..") {
            bail!("--frame-files `{text}` must be a path inside the job folder (relative to the scene's folder, without `..`)");
        }
        let mut tokens = Vec::new();
        for c in text.chars() {
            match (c, tokens.last_mut()) {
                ('#', Some(Token::Frame(n))) => *n += 1,
                ('#', _) => tokens.push(Token::Frame(1)),
                ('*', Some(Token::Star)) => {}
                ('*', _) => tokens.push(Token::Star),
                (c, _) => tokens.push(Token::Literal(c)),
            }
        }
        match tokens.iter().filter(|t| matches!(t, Token::Frame(_))).count() {
            1 => Ok(Pattern { tokens }),
            0 => bail!("--frame-files `{text}` has no run of `#` for the frame number (for example `cache/fluid_data_####.vdb`)"),
            _ => bail!("--frame-files `{text}` has more than one run of `#`; one stands for the frame number"),
        }
    }

    /// The frame `path` belongs to, when it matches.
    pub fn frame_of(&self, path: &str) -> Option<u32> {
        let chars: Vec<char> = path.chars().collect();
        match_from(&self.tokens, &chars).flatten()
    }
}

/// `None`: no match; `Some(frame)`: a match, with the frame number once
/// the frame token was passed.
fn match_from(tokens: &[Token], s: &[char]) -> Option<Option<u32>> {
    let Some((first, rest)) = tokens.split_first() else {
        return s.is_empty().then_some(None);
    };
    match *first {
        Token::Literal(c) => match s.split_first() {
            Some((&h, tail)) if h == c => match_from(rest, tail),
            _ => None,
        },
        Token::Star => {
            let most = s.iter().position(|&c| c == '/').unwrap_or(s.len());
            (0..=most).find_map(|n| match_from(rest, &s[n..]))
        }
        Token::Frame(min) => {
            let digits = s.iter().take_while(|c| c.is_ascii_digit()).count();
            (min..=digits).rev().find_map(|n| {
                let frame: u32 = s[..n].iter().collect::<String>().parse().ok()?;
                match_from(rest, &s[n..]).map(|_| Some(frame))
            })
        }
    }
}

/// The frame each of `paths` belongs to under `patterns` (the first that
/// matches), `None` for a file every task needs. `paths[0]` is the scene
/// file, which every task needs. Every pattern must match a file.
pub fn assign(patterns: &[String], paths: &[&str]) -> anyhow::Result<Vec<Option<u32>>> {
    if patterns.len() > MAX_PATTERNS {
        bail!("at most {MAX_PATTERNS} --frame-files patterns; nothing was uploaded");
    }
    let parsed = (patterns.iter())
        .map(|p| Pattern::parse(p).map_err(|e| anyhow::anyhow!("{e}; nothing was uploaded")))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let mut used = vec![false; parsed.len()];
    let mut frames = Vec::with_capacity(paths.len());
    for (i, path) in paths.iter().enumerate() {
        let found = (parsed.iter().enumerate()).find_map(|(k, p)| p.frame_of(path).map(|f| (k, f)));
        if let Some((k, _)) = found {
            if i == 0 {
                bail!(
                    "--frame-files `{}` matches the scene file `{path}`, which every task needs; nothing was uploaded",
                    patterns[k]
                );
            }
            used[k] = true;
        }
        frames.push(found.map(|(_, f)| f));
    }
    if let Some(k) = used.iter().position(|u| !u) {
        let example = paths.get(1).or(paths.first()).copied().unwrap_or("");
        bail!(
            "--frame-files `{}` matches none of the job's {} files; a pattern is a path in the job folder, like `{example}`; nothing was uploaded",
            patterns[k],
            paths.len()
        );
    }
    Ok(frames)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(pattern: &str, path: &str) -> Option<u32> {
        Pattern::parse(pattern).unwrap().frame_of(path)
    }

    #[test]
    fn a_run_of_hashes_is_the_frame_number_and_a_star_stays_in_its_folder() {
        assert_eq!(
            frame("cache/fluid_####.vdb", "cache/fluid_0042.vdb"),
            Some(42)
        );
        // More digits than the run past frame 9999, as Blender writes them.
        assert_eq!(
            frame("cache/fluid_####.vdb", "cache/fluid_12345.vdb"),
            Some(12345)
        );
        assert_eq!(frame("cache/fluid_####.vdb", "cache/fluid_042.vdb"), None);
        assert_eq!(
            frame("cache/fluid_####.vdb", "cache/fluid_0042.vdb.bak"),
            None
        );
        assert_eq!(frame("cache/fluid_####.vdb", "other/fluid_0042.vdb"), None);
        assert_eq!(
            frame("cache/*_####.vdb", "cache/data_mesh_0007.vdb"),
            Some(7)
        );
        assert_eq!(frame("cache/*_####.vdb", "cache/sub/data_0007.vdb"), None);
        // Digits before the run belong to the star, the last run to the frame.
        assert_eq!(frame("c/*####.bphys", "c/7A_000012.bphys"), Some(12));
        assert_eq!(frame("seq/####/*", "seq/0003/a.exr"), Some(3));
        assert_eq!(frame("f_#.png", "f_99999999999.png"), None, "past u32");
    }

    #[test]
    fn bad_patterns_say_why() {
        let e = |p: &str| Pattern::parse(p).unwrap_err().to_string();
        assert!(e("cache/fluid.vdb").contains("no run of `#`"));
        assert!(e("a_##_##.png").contains("more than one run"));
        assert!(e("/abs/f_##.png").contains("inside the job folder"));
        assert!(e("../f_##.png").contains("inside the job folder"));
        assert!(e("").contains("1 to 1024"));
    }

    #[test]
    fn files_get_their_frame_and_every_pattern_must_match_one() {
        let paths = [
            "shot.blend",
            "tex/wood.png",
            "cache/f_0001.vdb",
            "cache/f_0002.vdb",
        ];
        let got = assign(&["cache/f_####.vdb".into()], &paths).unwrap();
        assert_eq!(got, vec![None, None, Some(1), Some(2)]);
        assert_eq!(assign(&[], &paths).unwrap(), vec![None; 4]);
        let e = assign(&["cache/g_####.vdb".into()], &paths)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("matches none of the job's 4 files") && e.contains("tex/wood.png"),
            "{e}"
        );
        let e = assign(&["shot_##.blend".into()], &["shot_01.blend", "a.png"]).unwrap_err();
        assert!(e.to_string().contains("matches the scene file"), "{e}");
    }
}
