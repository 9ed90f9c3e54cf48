//! Job description types shared by client, coordinator and worker: frame
//! sets, tile grids, sample ranges, engines, manifests, and the rules that
//! make a manifest path safe to lay out on a worker's disk.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::Digest;

/// Which renderer a job needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Engine {
    /// The embedded CPU path tracer for `*.scene.json` files.
    Builtin,
    /// Blender, driven as `blender -b`.
    Blender,
    /// Unreal Movie Render Queue.
    Unreal,
    /// Renders nothing: a one-byte result per task. For dispatch benchmarks.
    Noop,
}

impl Engine {
    pub fn name(self) -> &'static str {
        match self {
            Engine::Builtin => "builtin",
            Engine::Blender => "blender",
            Engine::Unreal => "unreal",
            Engine::Noop => "noop",
        }
    }
}

impl fmt::Display for Engine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Engine {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "builtin" => Ok(Engine::Builtin),
            "blender" => Ok(Engine::Blender),
            "unreal" => Ok(Engine::Unreal),
            "noop" => Ok(Engine::Noop),
            _ => Err(format!(
                "unknown engine `{s}` (expected builtin, blender, unreal or noop)"
            )),
        }
    }
}

/// A rectangle of pixels, origin at the top-left of the frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct TileRect {
    pub x: u32,
    pub y: u32,
    pub width: u32,
    pub height: u32,
}

/// How a frame is cut into tiles: `cols` × `rows`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct TileGrid {
    pub cols: u32,
    pub rows: u32,
}

impl TileGrid {
    pub const WHOLE: TileGrid = TileGrid { cols: 1, rows: 1 };

    pub fn count(self) -> u32 {
        self.cols * self.rows
    }

    /// The rectangle of tile `i` (row-major) of a `width` × `height` frame.
    /// Tiles cover the frame exactly; the last column and row take the remainder.
    pub fn rect(self, i: u32, width: u32, height: u32) -> TileRect {
        let (c, r) = (i % self.cols, i / self.cols);
        let x0 = width * c / self.cols;
        let x1 = width * (c + 1) / self.cols;
        let y0 = height * r / self.rows;
        let y1 = height * (r + 1) / self.rows;
        TileRect {
            x: x0,
            y: y0,
            width: x1 - x0,
            height: y1 - y0,
        }
    }
}

impl FromStr for TileGrid {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let err = || format!("`{s}` is not a tile grid: expected COLSxROWS, e.g. 4x4");
        let (c, r) = s.split_once(['x', 'X']).ok_or_else(err)?;
        let cols: u32 = c.trim().parse().map_err(|_| err())?;
        let rows: u32 = r.trim().parse().map_err(|_| err())?;
        if cols == 0 || rows == 0 || cols > 64 || rows > 64 {
            return Err(format!("`{s}`: tiles per side must be between 1 and 64"));
        }
        Ok(TileGrid { cols, rows })
    }
}

impl fmt::Display for TileGrid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}x{}", self.cols, self.rows)
    }
}

/// Parses a frame list: `1-250`, `1,5,9`, or a mix such as `1-3,7,10-12`.
/// The result is sorted and free of duplicates.
pub fn parse_frames(s: &str) -> Result<Vec<u32>, String> {
    let mut frames = Vec::new();
    for part in s.split(',') {
        let part = part.trim();
        let bad = || format!("`{s}` is not a frame list: expected e.g. 1-250 or 1,5,9");
        if part.is_empty() {
            return Err(bad());
        }
        if let Some((a, b)) = part.split_once('-') {
            let a: u32 = a.trim().parse().map_err(|_| bad())?;
            let b: u32 = b.trim().parse().map_err(|_| bad())?;
            if b < a {
                return Err(format!("frame range `{part}` ends before it starts"));
            }
            if b - a > 1_000_000 {
                return Err(format!("frame range `{part}` is too long"));
            }
            frames.extend(a..=b);
        } else {
            frames.push(part.parse().map_err(|_| bad())?);
        }
    }
    frames.sort_unstable();
    frames.dedup();
    Ok(frames)
}

/// Image format of the stitched frames.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum OutputFormat {
    Png,
    Exr,
    /// Any other still format the renderer writes (JPEG, TIFF, …): whole
    /// frames only, delivered as the renderer wrote them.
    Image,
}

impl OutputFormat {
    pub fn extension(self) -> &'static str {
        match self {
            OutputFormat::Png => "png",
            OutputFormat::Exr => "exr",
            OutputFormat::Image => "img",
        }
    }
}

/// Longest frame-name template a job may carry.
pub const MAX_OUTPUT_NAME: usize = 255;

/// The file name of `frame` from a scene's output name template, as
/// Blender names it: the last run of `#` becomes the frame number,
/// zero-padded to the run's length (`sh010_####.exr`, 7 → `sh010_0007.exr`).
/// `None` when the template is not a plain file name.
pub fn frame_file_name(template: &str, frame: u32) -> Option<String> {
    if template.is_empty()
        || template.len() > MAX_OUTPUT_NAME
        || template.contains(['/', '\\', '\0'])
        || template == "."
        || template == ".."
    {
        return None;
    }
    let end = template.rfind('#')? + 1;
    let start = template[..end].trim_end_matches('#').len();
    let digits = end - start;
    let name = format!("{}{frame:0digits$}{}", &template[..start], &template[end..]);
    (name != "." && name != "..").then_some(name)
}

/// One file of a job: where it goes in the job's folder, and its content.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ManifestEntry {
    pub path: String,
    pub digest: Digest,
    pub size: u64,
    /// Where the file was on the submitting machine (absolute), for engines
    /// whose scene files name their dependencies by path (Blender).
    pub origin: Option<String>,
}

/// What a client submits.
/// `JobSpec::sample_ranges` asking the coordinator to choose: split tiles
/// into sample ranges when interruptible workers could lose them.
pub const SAMPLE_RANGES_AUTO: u32 = 0;

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct JobSpec {
    /// Chosen by the client; a retried submit with the same id gets the same job.
    pub request_id: Option<String>,
    pub name: String,
    pub engine: Engine,
    /// Manifest path of the scene file.
    pub scene: String,
    pub manifest: Vec<ManifestEntry>,
    pub frames: Vec<u32>,
    pub tiles: TileGrid,
    /// Sample ranges per tile, each a task of its own;
    /// [`SAMPLE_RANGES_AUTO`] lets the coordinator choose.
    pub sample_ranges: u32,
    pub samples: u32,
    pub resolution: (u32, u32),
    pub priority: i32,
    pub output: OutputFormat,
    /// For Blender jobs: the Blender that saved the file and what the job
    /// needs of the one that renders it. `None` for other engines (and for
    /// jobs stored before this existed).
    #[serde(default)]
    pub blender: Option<crate::blender::BlenderNeeds>,
    /// The scene's own frame-name template (`sh010_####.exr`), if it has
    /// one; frames are then named by [`frame_file_name`].
    #[serde(default)]
    pub output_name: Option<String>,
}

/// Why a manifest path was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PathError {
    #[error("manifest path `{0}` is absolute; paths must be relative to the job folder")]
    Absolute(String),
    #[error("manifest path `{0}` climbs out of the job folder with `..`")]
    ParentDir(String),
    #[error("manifest path {0:?} contains a NUL byte")]
    Nul(String),
    #[error("manifest path `{0}` has an empty or `.` component")]
    EmptyComponent(String),
    #[error("manifest path `{0}` contains a backslash or drive prefix")]
    Backslash(String),
}

/// Checks that `path` is a plain relative path (`a/b/c.png`) that stays inside
/// the job folder on every platform. Returns its components.
pub fn sanitize_manifest_path(path: &str) -> Result<Vec<&str>, PathError> {
    let owned = || path.to_string();
    if path.contains('\0') {
        return Err(PathError::Nul(owned()));
    }
    if path.starts_with('/') {
        return Err(PathError::Absolute(owned()));
    }
    if path.contains('\\') || path.contains(':') {
        return Err(PathError::Backslash(owned()));
    }
    let parts: Vec<&str> = path.split('/').collect();
    for part in &parts {
        match *part {
            ".." => return Err(PathError::ParentDir(owned())),
            "" | "." => return Err(PathError::EmptyComponent(owned())),
            _ => {}
        }
    }
    Ok(parts)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_are_named_as_blender_names_them() {
        assert_eq!(
            frame_file_name("sh010_####.exr", 1).as_deref(),
            Some("sh010_0001.exr")
        );
        assert_eq!(
            frame_file_name("####.png", 12345).as_deref(),
            Some("12345.png")
        );
        assert_eq!(
            frame_file_name("a#b##.jpg", 7).as_deref(),
            Some("a#b07.jpg")
        );
        assert_eq!(frame_file_name("render", 7), None, "no frame number");
        for bad in ["../####.png", "a/####", "", "x\0####"] {
            assert_eq!(frame_file_name(bad, 1), None, "{bad:?}");
        }
    }

    #[test]
    fn frames() {
        assert_eq!(parse_frames("1-4").unwrap(), vec![1, 2, 3, 4]);
        assert_eq!(parse_frames("9,1,5").unwrap(), vec![1, 5, 9]);
        assert_eq!(parse_frames("1-3,2,7").unwrap(), vec![1, 2, 3, 7]);
        assert!(parse_frames("4-1")
            .unwrap_err()
            .contains("ends before it starts"));
        assert!(parse_frames("a").is_err());
        assert!(parse_frames("1,,2").is_err());
    }

    #[test]
    fn tile_grid_covers_frame_exactly() {
        let g: TileGrid = "3x3".parse().unwrap();
        let (w, h) = (100, 61);
        let mut covered = vec![0u8; (w * h) as usize];
        for i in 0..g.count() {
            let r = g.rect(i, w, h);
            for y in r.y..r.y + r.height {
                for x in r.x..r.x + r.width {
                    covered[(y * w + x) as usize] += 1;
                }
            }
        }
        assert!(covered.iter().all(|&c| c == 1));
        assert!("0x2".parse::<TileGrid>().is_err());
        assert!("4".parse::<TileGrid>().unwrap_err().contains("COLSxROWS"));
    }

    #[test]
    fn hostile_manifest_paths_are_refused() {
        assert_eq!(
            sanitize_manifest_path("textures/a.png").unwrap(),
            vec!["textures", "a.png"]
        );
        assert!(matches!(
            sanitize_manifest_path("../../x"),
            Err(PathError::ParentDir(_))
        ));
        assert!(matches!(
            sanitize_manifest_path("a/../../x"),
            Err(PathError::ParentDir(_))
        ));
        assert!(matches!(
            sanitize_manifest_path("/etc/x"),
            Err(PathError::Absolute(_))
        ));
        assert!(matches!(
            sanitize_manifest_path("a\0b"),
            Err(PathError::Nul(_))
        ));
        assert!(matches!(
            sanitize_manifest_path("a//b"),
            Err(PathError::EmptyComponent(_))
        ));
        assert!(matches!(
            sanitize_manifest_path(""),
            Err(PathError::EmptyComponent(_))
        ));
        assert!(matches!(
            sanitize_manifest_path("C:\\x"),
            Err(PathError::Backslash(_))
        ));
        let msg = sanitize_manifest_path("../../x").unwrap_err().to_string();
        assert_eq!(
            msg,
            "manifest path `../../x` climbs out of the job folder with `..`"
        );
    }
}
