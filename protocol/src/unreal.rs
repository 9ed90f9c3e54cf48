//! Unreal Engine jobs: a level sequence rendered by Movie Render Queue
//! (MRQ), split into tasks by shot and by frame chunk, and the bundle a
//! chunk task sends back (one file per frame, named as MRQ names it).
//!
//! What this follows, from Epic's documentation (nothing here has been run
//! against a real Unreal; the tests use a stand-in):
//! - The smallest unit MRQ can spread over machines is a shot (a camera
//!   cut), "because Unreal Engine's real-time features rely on information
//!   from previous frames": <https://dev.epicgames.com/documentation/en-us/unreal-engine/using-command-line-rendering-with-move-render-queue-in-unreal-engine>.
//!   A chunk that starts inside a shot is therefore rendered from
//!   [`UnrealJob::warm_up`] frames earlier, and those frames are thrown
//!   away, so its first kept frame has the history a continuous render has.
//! - The playback range is overridden with `bUseCustomPlaybackRange`,
//!   `CustomStartFrame` and `CustomEndFrame` of the output setting
//!   ("in Display Rate frames"): <https://dev.epicgames.com/documentation/en-us/unreal-engine/API/Plugins/MovieRenderPipelineCore/UMoviePipelineOutputSetting>.
//! - MRQ warms each shot up itself at the start of the range it renders
//!   (`EngineWarmUpCount`, `RenderWarmUpCount` of the anti-aliasing
//!   setting): <https://dev.epicgames.com/documentation/unreal-engine/API/Plugins/MovieRenderPipelineCore/UMoviePipelineAntiAliasingSettin-/EngineWarmUpCoun-?application_version=5.4>.
//! - File names come from the output setting's `FileNameFormat` (tokens
//!   such as `{sequence_name}`, `{shot_name}`, `{frame_number}`) with
//!   frame numbers padded to `ZeroPadFrameNumbers` digits
//!   ("MySequence_1.png -> MySequence_0001.png"), and the image format's
//!   extension: <https://dev.epicgames.com/documentation/unreal-engine/API/Plugins/MovieRenderPipelineCore/UMoviePipelineOutputSetting/ZeroPadFrameNumb-?application_version=5.4>.

use serde::{Deserialize, Serialize};

use crate::job::OutputFormat;

/// Longest asset path, shot name or file name format a job may carry.
pub const MAX_UNREAL_TEXT: usize = 255;
/// Shots in one job.
pub const MAX_SHOTS: usize = 10_000;
/// Frames in one chunk task (and so in one bundle).
pub const MAX_CHUNK_FRAMES: u32 = 10_000;
/// Warm-up frames before a chunk.
pub const MAX_WARM_UP: u32 = 10_000;
/// MRQ's own default `FileNameFormat`.
pub const DEFAULT_FILE_NAME_FORMAT: &str = "{sequence_name}.{frame_number}";
/// MRQ's own default `ZeroPadFrameNumbers`.
pub const DEFAULT_ZERO_PAD: u32 = 4;

/// One shot (camera cut) of the level sequence: frames `first..=last`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Shot {
    pub name: String,
    pub first: u32,
    pub last: u32,
}

/// What an Unreal job renders, besides the frames and files of its
/// [`crate::job::JobSpec`] (whose `scene` is the `.uproject`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UnrealJob {
    /// `/Game/...` path of the level sequence asset.
    pub level_sequence: String,
    /// `/Game/...` path of the map to load.
    pub map: String,
    /// `/Game/...` path of the `MoviePipelinePrimaryConfig` preset.
    pub config: String,
    /// The sequence's shots; empty means one shot spanning the job's frames.
    pub shots: Vec<Shot>,
    /// Frames per task; 0 renders each shot as one task.
    pub chunk: u32,
    /// Frames rendered and discarded before a chunk that starts inside a
    /// shot (never before the shot's first frame).
    pub warm_up: u32,
    /// The config's `FileNameFormat`.
    pub file_name_format: String,
    /// The config's `ZeroPadFrameNumbers`.
    pub zero_pad: u32,
}

/// One task of an Unreal job: frames `spec.frames[first_pos..first_pos +
/// len]`, consecutive and within one shot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Chunk {
    /// Index into [`UnrealJob::shots`] (0 when the job names none).
    pub shot: usize,
    pub first_pos: u32,
    pub len: u32,
}

/// What a worker tells MRQ for one chunk: render frames `from..=to`, keep
/// `keep_from..=to`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct RenderRange {
    pub from: u32,
    pub keep_from: u32,
    pub to: u32,
}

/// One chunk task as a worker is given it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct UnrealTask {
    /// Index into [`UnrealJob::shots`] (0 when the job names none).
    pub shot: u32,
    pub range: RenderRange,
}

impl UnrealJob {
    /// Task `chunk` of a job with these frames, as a worker is given it.
    pub fn task(&self, frames: &[u32], chunk: Chunk) -> UnrealTask {
        UnrealTask {
            shot: chunk.shot as u32,
            range: self.render_range(frames, chunk),
        }
    }

    /// The shot frame `frame` lies in, as (index, first frame).
    fn shot_of(&self, frame: u32, frames: &[u32]) -> Option<(usize, u32)> {
        if self.shots.is_empty() {
            return frames.first().map(|&f| (0, f));
        }
        (self.shots.iter().enumerate())
            .find(|(_, s)| s.first <= frame && frame <= s.last)
            .map(|(i, s)| (i, s.first))
    }

    /// Splits `frames` (sorted, as [`crate::job::parse_frames`] makes them)
    /// into tasks: runs of consecutive frames of one shot, at most
    /// [`UnrealJob::chunk`] long. `frames` must have passed [`UnrealJob::check`].
    pub fn chunks(&self, frames: &[u32]) -> Vec<Chunk> {
        let mut out: Vec<Chunk> = Vec::new();
        for (pos, &frame) in frames.iter().enumerate() {
            let shot = self.shot_of(frame, frames).map_or(0, |(i, _)| i);
            if let Some(last) = out.last_mut() {
                let prev = frames[(last.first_pos + last.len - 1) as usize];
                let full = self.chunk != 0 && last.len >= self.chunk;
                if last.shot == shot && prev.checked_add(1) == Some(frame) && !full {
                    last.len += 1;
                    continue;
                }
            }
            out.push(Chunk {
                shot,
                first_pos: pos as u32,
                len: 1,
            });
        }
        out
    }

    /// The range MRQ renders for `chunk`: from `warm_up` frames before its
    /// first frame, but never before its shot's first frame (where MRQ's
    /// own shot warm-up applies, as in a continuous render).
    pub fn render_range(&self, frames: &[u32], chunk: Chunk) -> RenderRange {
        let first = frames[chunk.first_pos as usize];
        let last = frames[(chunk.first_pos + chunk.len - 1) as usize];
        let shot_first = self.shot_of(first, frames).map_or(first, |(_, f)| f);
        RenderRange {
            from: first.saturating_sub(self.warm_up).max(shot_first),
            keep_from: first,
            to: last,
        }
    }

    /// The frames chunk `chunk` keeps, each with the file name MRQ gives it.
    pub fn expected_frames(
        &self,
        frames: &[u32],
        chunk: Chunk,
        format: OutputFormat,
    ) -> Vec<(u32, String)> {
        let kept = &frames[chunk.first_pos as usize..(chunk.first_pos + chunk.len) as usize];
        (kept.iter())
            .map(|&f| (f, self.file_name_in_shot(chunk.shot, f, format)))
            .collect()
    }

    /// The shot's name for `{shot_name}`: the shot's own, or the sequence's.
    pub fn shot_name(&self, shot: usize) -> &str {
        match self.shots.get(shot) {
            Some(s) => &s.name,
            None => asset_name(&self.level_sequence),
        }
    }

    /// The file MRQ writes for `frame`, by [`UnrealJob::file_name_format`].
    pub fn frame_file_name(&self, frames: &[u32], frame: u32, format: OutputFormat) -> String {
        let shot = self.shot_of(frame, frames).map_or(0, |(i, _)| i);
        self.file_name_in_shot(shot, frame, format)
    }

    /// The file MRQ writes for `frame` of shot index `shot`.
    pub fn file_name_in_shot(&self, shot: usize, frame: u32, format: OutputFormat) -> String {
        let digits = self.zero_pad as usize;
        let name = self
            .file_name_format
            .replace("{sequence_name}", asset_name(&self.level_sequence))
            .replace("{shot_name}", self.shot_name(shot))
            .replace("{frame_number}", &format!("{frame:0digits$}"));
        format!("{name}.{}", format.extension())
    }

    /// Checks what a client sent: asset paths, shots, names, counts.
    pub fn check(&self, frames: &[u32], format: OutputFormat) -> Result<(), String> {
        for (what, path) in [
            ("level sequence", &self.level_sequence),
            ("map", &self.map),
            ("movie pipeline config", &self.config),
        ] {
            content_path(path, "uasset").map_err(|e| format!("{what}: {e}"))?;
        }
        if !matches!(format, OutputFormat::Png | OutputFormat::Exr) {
            return Err("an Unreal job writes PNG or EXR frames".into());
        }
        if self.shots.len() > MAX_SHOTS {
            return Err(format!("at most {MAX_SHOTS} shots"));
        }
        for s in &self.shots {
            if s.first > s.last {
                return Err(format!("shot `{}` ends before it starts", s.name));
            }
            check_name(&s.name).map_err(|e| format!("shot name: {e}"))?;
        }
        let mut sorted: Vec<&Shot> = self.shots.iter().collect();
        sorted.sort_by_key(|s| s.first);
        if let Some(w) = sorted.windows(2).find(|w| w[1].first <= w[0].last) {
            return Err(format!("shots `{}` and `{}` overlap", w[0].name, w[1].name));
        }
        if let Some(&f) = frames.iter().find(|&&f| self.shot_of(f, frames).is_none()) {
            return Err(format!("frame {f} lies in none of the shots"));
        }
        if self.chunk > MAX_CHUNK_FRAMES || self.warm_up > MAX_WARM_UP {
            return Err(format!(
                "chunks and warm-ups are at most {MAX_CHUNK_FRAMES} frames"
            ));
        }
        if self.zero_pad == 0 || self.zero_pad > 9 {
            return Err("ZeroPadFrameNumbers must be between 1 and 9".into());
        }
        let fmt = &self.file_name_format;
        if fmt.len() > MAX_UNREAL_TEXT || !fmt.contains("{frame_number}") {
            return Err(format!(
                "file name format `{fmt}` must contain {{frame_number}} (and be at most {MAX_UNREAL_TEXT} bytes)"
            ));
        }
        let rest = ["{sequence_name}", "{shot_name}", "{frame_number}"]
            .iter()
            .fold(fmt.clone(), |s, t| s.replace(t, ""));
        if rest.contains(['{', '}']) {
            return Err(format!(
                "file name format `{fmt}`: Tessera knows the tokens {{sequence_name}}, {{shot_name}} and {{frame_number}} only"
            ));
        }
        check_name(&rest.replace('.', "_")).map_err(|e| format!("file name format: {e}"))?;
        let chunks = self.chunks(frames);
        if chunks.len() > crate::job::limits::MAX_TASKS as usize {
            return Err("too many tasks".into());
        }
        Ok(())
    }
}

/// The last component of an asset path: `/Game/Seq/Shot010` → `Shot010`
/// (an object path's `.Shot010` suffix is dropped).
pub fn asset_name(path: &str) -> &str {
    let last = path.rsplit('/').next().unwrap_or(path);
    last.split('.').next().unwrap_or(last)
}

/// The file under the project folder that holds `/Game/...` asset `path`:
/// `/Game/Seq/Shot010` → `Content/Seq/Shot010.uasset` (`ext` `umap` for maps).
/// An object path (`/Game/Seq/Shot010.Shot010`) names the same file.
pub fn content_path(path: &str, ext: &str) -> Result<String, String> {
    let rest = path
        .strip_prefix("/Game/")
        .ok_or_else(|| format!("`{path}` is not a /Game/... asset path"))?;
    if path.len() > MAX_UNREAL_TEXT {
        return Err(format!("`{path}` is longer than {MAX_UNREAL_TEXT} bytes"));
    }
    let package = match rest.rsplit_once('/') {
        Some((dir, last)) => format!("{dir}/{}", last.split('.').next().unwrap_or(last)),
        None => rest.split('.').next().unwrap_or(rest).to_string(),
    };
    let file = format!("Content/{package}.{ext}");
    crate::job::sanitize_manifest_path(&file).map_err(|e| format!("`{path}`: {e}"))?;
    if package.contains(['\\', ':', '"', ' ', '\0']) || package.is_empty() {
        return Err(format!("`{path}` is not a plain asset path"));
    }
    Ok(file)
}

fn check_name(name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= MAX_UNREAL_TEXT
        && (name.chars()).all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'));
    if ok && name != "." && name != ".." {
        Ok(())
    } else {
        Err(format!(
            "`{name}` must be 1 to {MAX_UNREAL_TEXT} letters, digits, `_`, `-` or `.`"
        ))
    }
}

/// What a chunk task sends back: each kept frame's file, as MRQ wrote it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bundle {
    pub frames: Vec<BundleFrame>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BundleFrame {
    pub frame: u32,
    pub name: String,
    pub bytes: Vec<u8>,
}

const BUNDLE_MAGIC: &[u8; 8] = b"TSRUNRB1";

impl Bundle {
    /// `magic, count: u32, then per frame: frame u32, name length u16,
    /// name, length u64, bytes` (little-endian).
    pub fn encode(&self) -> Vec<u8> {
        let size: usize = (self.frames.iter())
            .map(|f| 14 + f.name.len() + f.bytes.len())
            .sum();
        let mut out = Vec::with_capacity(12 + size);
        out.extend_from_slice(BUNDLE_MAGIC);
        out.extend_from_slice(&(self.frames.len() as u32).to_le_bytes());
        for f in &self.frames {
            out.extend_from_slice(&f.frame.to_le_bytes());
            out.extend_from_slice(&(f.name.len() as u16).to_le_bytes());
            out.extend_from_slice(f.name.as_bytes());
            out.extend_from_slice(&(f.bytes.len() as u64).to_le_bytes());
            out.extend_from_slice(&f.bytes);
        }
        out
    }

    /// Checks a chunk task's bundle against what the task asked for: the
    /// frames `expected` (frame, the job's file name for it), each once, in
    /// order, each file in `format` (its signature).
    pub fn check(&self, expected: &[(u32, String)], format: OutputFormat) -> Result<(), String> {
        if self.frames.len() != expected.len() {
            return Err(format!(
                "the bundle holds {} frames; the chunk has {}",
                self.frames.len(),
                expected.len()
            ));
        }
        for (f, (frame, name)) in self.frames.iter().zip(expected) {
            if f.frame != *frame || f.name != *name {
                return Err(format!(
                    "the bundle holds frame {} as `{}` where frame {frame} as `{name}` was due",
                    f.frame, f.name
                ));
            }
            let signed = match format {
                OutputFormat::Png => f.bytes.starts_with(b"\x89PNG\r\n\x1a\n"),
                OutputFormat::Exr => f.bytes.starts_with(&[0x76, 0x2f, 0x31, 0x01]),
                OutputFormat::Image => false,
            };
            if !signed {
                return Err(format!("`{name}` is not a {} file", format.extension()));
            }
        }
        Ok(())
    }

    pub fn is_bundle(bytes: &[u8]) -> bool {
        bytes.starts_with(BUNDLE_MAGIC)
    }

    /// Reads a bundle a worker sent; every count and length is checked
    /// against what is left before it is used.
    pub fn decode(bytes: &[u8]) -> Result<Bundle, String> {
        let mut rest = bytes
            .strip_prefix(BUNDLE_MAGIC.as_slice())
            .ok_or("not a frame bundle")?;
        let count = u32::from_le_bytes(take(&mut rest, 4)?.try_into().expect("4 bytes"));
        if count > MAX_CHUNK_FRAMES {
            return Err(format!("frame bundle claims {count} frames"));
        }
        let mut frames = Vec::new();
        for _ in 0..count {
            let frame = u32::from_le_bytes(take(&mut rest, 4)?.try_into().expect("4 bytes"));
            let n = u16::from_le_bytes(take(&mut rest, 2)?.try_into().expect("2 bytes"));
            let name = std::str::from_utf8(take(&mut rest, n as usize)?)
                .map_err(|_| "frame bundle: a name is not UTF-8")?
                .to_string();
            let len = u64::from_le_bytes(take(&mut rest, 8)?.try_into().expect("8 bytes"));
            let len = usize::try_from(len).map_err(|_| "frame bundle: a frame is too large")?;
            let bytes = take(&mut rest, len)?.to_vec();
            frames.push(BundleFrame { frame, name, bytes });
        }
        if !rest.is_empty() {
            return Err("frame bundle has bytes after its last frame".into());
        }
        Ok(Bundle { frames })
    }
}

/// The next `n` bytes of `rest`, or an error when fewer are left.
fn take<'a>(rest: &mut &'a [u8], n: usize) -> Result<&'a [u8], String> {
    if rest.len() < n {
        return Err("frame bundle is cut short".into());
    }
    let (head, tail) = rest.split_at(n);
    *rest = tail;
    Ok(head)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(shots: &[(&str, u32, u32)], chunk: u32, warm_up: u32) -> UnrealJob {
        UnrealJob {
            level_sequence: "/Game/Seq/Main".into(),
            map: "/Game/Maps/Main".into(),
            config: "/Game/Cinematics/Config".into(),
            shots: (shots.iter())
                .map(|&(n, a, b)| Shot {
                    name: n.into(),
                    first: a,
                    last: b,
                })
                .collect(),
            chunk,
            warm_up,
            file_name_format: DEFAULT_FILE_NAME_FORMAT.into(),
            zero_pad: DEFAULT_ZERO_PAD,
        }
    }

    #[test]
    fn shots_split_into_chunks_that_never_cross_a_cut() {
        let j = job(&[("sh010", 1, 5), ("sh020", 6, 9), ("sh030", 10, 12)], 3, 2);
        let frames: Vec<u32> = (1..=12).collect();
        let chunks: Vec<(usize, u32, u32)> = (j.chunks(&frames).iter())
            .map(|c| (c.shot, frames[c.first_pos as usize], c.len))
            .collect();
        assert_eq!(
            chunks,
            vec![(0, 1, 3), (0, 4, 2), (1, 6, 3), (1, 9, 1), (2, 10, 3)]
        );
        // A chunk inside a shot warms up from two frames earlier; the
        // first chunk of a shot, and one near its start, from the cut.
        let c = j.chunks(&frames);
        let r = |i: usize| j.render_range(&frames, c[i]);
        assert_eq!(
            r(1),
            RenderRange {
                from: 2,
                keep_from: 4,
                to: 5
            }
        );
        assert_eq!(
            r(2),
            RenderRange {
                from: 6,
                keep_from: 6,
                to: 8
            }
        );
        assert_eq!(
            r(3),
            RenderRange {
                from: 7,
                keep_from: 9,
                to: 9
            }
        );
        // Chunk 0 renders whole shots; a gap in the frames starts a task.
        let whole = job(&[("a", 1, 10)], 0, 4);
        let gap = [1, 2, 3, 7, 8];
        let c = whole.chunks(&gap);
        assert_eq!(c.len(), 2);
        assert_eq!(
            whole.render_range(&gap, c[1]),
            RenderRange {
                from: 3,
                keep_from: 7,
                to: 8
            }
        );
    }

    #[test]
    fn frames_are_named_as_mrq_names_them() {
        let mut j = job(&[("sh010", 1, 5)], 0, 0);
        assert_eq!(
            j.frame_file_name(&[1], 3, OutputFormat::Png),
            "Main.0003.png"
        );
        j.file_name_format = "{sequence_name}_{shot_name}.{frame_number}".into();
        j.zero_pad = 6;
        assert_eq!(
            j.frame_file_name(&[1], 3, OutputFormat::Exr),
            "Main_sh010.000003.exr"
        );
    }

    #[test]
    fn bad_jobs_are_refused_with_what_is_wrong() {
        let frames: Vec<u32> = (1..=12).collect();
        let ok = job(&[("sh010", 1, 6), ("sh020", 7, 12)], 0, 0);
        assert_eq!(ok.check(&frames, OutputFormat::Png), Ok(()));
        let refused = |f: &dyn Fn(&mut UnrealJob)| {
            let mut j = ok.clone();
            f(&mut j);
            j.check(&frames, OutputFormat::Png).unwrap_err()
        };
        assert!(refused(&|j| j.shots[1].first = 9).contains("frame 7 lies in none"));
        assert!(refused(&|j| j.shots[1].first = 20).contains("ends before it starts"));
        assert!(refused(&|j| j.shots[1].first = 5).contains("overlap"));
        assert!(refused(&|j| j.map = "/Engine/Maps/X".into()).contains("map"));
        assert!(refused(&|j| j.config = "/Game/../../etc".into()).contains(".."));
        assert!(
            refused(&|j| j.file_name_format = "{camera_name}.{frame_number}".into())
                .contains("tokens")
        );
        assert!(refused(&|j| j.file_name_format = "a/{frame_number}".into())
            .contains("file name format"));
        assert!(refused(&|j| j.shots[0].name = "a b".into()).contains("shot name"));
        assert_eq!(
            content_path("/Game/Seq/Shot010.Shot010", "uasset").unwrap(),
            "Content/Seq/Shot010.uasset"
        );
        assert_eq!(
            content_path("/Game/Maps/Main", "umap").unwrap(),
            "Content/Maps/Main.umap"
        );
    }

    #[test]
    fn bundles_round_trip_and_hostile_ones_are_refused() {
        let b = Bundle {
            frames: vec![
                BundleFrame {
                    frame: 4,
                    name: "Main.0004.png".into(),
                    bytes: vec![1, 2, 3],
                },
                BundleFrame {
                    frame: 5,
                    name: "Main.0005.png".into(),
                    bytes: vec![],
                },
            ],
        };
        let bytes = b.encode();
        assert!(Bundle::is_bundle(&bytes));
        assert_eq!(Bundle::decode(&bytes).unwrap(), b);
        for cut in 0..bytes.len() {
            assert!(Bundle::decode(&bytes[..cut]).is_err(), "cut at {cut}");
        }
        let mut long = bytes.clone();
        long.push(0);
        assert!(Bundle::decode(&long)
            .unwrap_err()
            .contains("after its last"));
        let due = |n: &str| vec![(4, "Main.0004.png".to_string()), (5, n.to_string())];
        let png = |b: &mut Bundle| {
            for f in &mut b.frames {
                f.bytes = b"\x89PNG\r\n\x1a\nrest".to_vec();
            }
        };
        let mut good = b.clone();
        png(&mut good);
        assert_eq!(good.check(&due("Main.0005.png"), OutputFormat::Png), Ok(()));
        assert!(good
            .check(&due("Other.0005.png"), OutputFormat::Png)
            .unwrap_err()
            .contains("where frame 5 as `Other.0005.png` was due"));
        assert!(good
            .check(&due("Main.0005.png"), OutputFormat::Exr)
            .unwrap_err()
            .contains("not a exr"));
        assert!(
            b.check(&due("Main.0005.png"), OutputFormat::Png).is_err(),
            "no PNG signature"
        );
        assert!(good
            .check(&due("x")[..1], OutputFormat::Png)
            .unwrap_err()
            .contains("holds 2 frames"));
        let mut huge = bytes[..12].to_vec();
        huge[8..12].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(Bundle::decode(&huge).unwrap_err().contains("claims"));
    }
}
