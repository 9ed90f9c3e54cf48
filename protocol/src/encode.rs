//! Encode jobs: ffmpeg over the frames of the job they run after (an OpenJD
//! template's `ffmpeg` step). The job's one task runs on a worker that
//! offers the `ffmpeg` engine; its input frames are laid out in the job
//! folder as [`INPUT_DIR`]`/000001.EXT`, `000002.EXT`, … in frame order,
//! and its output is the movie, fetched like a frame under the job's
//! `output_name`.
//!
//! ffmpeg is never given a shell or a path of the template's: the worker
//! builds its command line from the options here, each checked against
//! [`check_option`] (what a render farm's encode step uses: frame rate,
//! codec, pixel format, quality), the input pattern it lays out itself and
//! an output file in its own scratch space. Options that read or write
//! other files (filters, extra inputs, `-attach`) are refused by name.

use serde::{Deserialize, Serialize};

/// What an encode job runs, besides its frames.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EncodeSpec {
    /// The job whose frames it encodes; one of the job's `after`.
    pub input: u64,
    /// ffmpeg options for the input, flag and value (`-framerate 24`).
    pub input_options: Vec<String>,
    /// ffmpeg options for the output (`-c:v libx264 -pix_fmt yuv420p`).
    pub output_options: Vec<String>,
}

/// The folder of the job where the input frames are laid out.
pub const INPUT_DIR: &str = "frames";

/// The most options (flags and values together) either list may hold.
pub const MAX_OPTIONS: usize = 64;

/// The movie containers an encode job may write, by file extension.
pub const CONTAINERS: &[&str] = &["mp4", "mov", "mkv", "webm", "avi", "gif"];

/// Codecs an encode job may ask for (`-c:v`).
pub const CODECS: &[&str] = &[
    "libx264",
    "libx265",
    "h264",
    "hevc",
    "libvpx",
    "libvpx-vp9",
    "libaom-av1",
    "libsvtav1",
    "mpeg4",
    "mjpeg",
    "png",
    "prores",
    "prores_ks",
    "ffv1",
    "gif",
];

/// The path in the job folder of the `position`-th input frame (from 0),
/// whose file has extension `ext`.
pub fn input_path(position: usize, ext: &str) -> String {
    format!("{INPUT_DIR}/{:06}.{ext}", position + 1)
}

/// ffmpeg's pattern for [`input_path`]'s files.
pub fn input_pattern(ext: &str) -> String {
    format!("{INPUT_DIR}/%06d.{ext}")
}

/// Whether `ext` is an image extension the input frames may have.
pub fn is_image_extension(ext: &str) -> bool {
    matches!(
        ext,
        "png" | "jpg" | "jpeg" | "exr" | "tif" | "tiff" | "bmp" | "tga" | "webp"
    )
}

/// Whether an encode job may write `name` (a plain file name whose
/// extension is one of [`CONTAINERS`]).
pub fn check_movie_name(name: &str) -> Result<(), String> {
    let ext = name.rsplit_once('.').map(|(_, e)| e.to_ascii_lowercase());
    if name.is_empty()
        || name.len() > crate::job::MAX_OUTPUT_NAME
        || name.contains(['/', '\\', '\0', '#'])
        || name.chars().any(char::is_control)
        || name.starts_with('.')
    {
        return Err(format!("`{name}` is not a plain file name for the movie"));
    }
    match ext {
        Some(e) if CONTAINERS.contains(&e.as_str()) => Ok(()),
        _ => Err(format!(
            "`{name}`: the movie's file name ends in one of .{}",
            CONTAINERS.join(", .")
        )),
    }
}

/// Whether `flag` takes a value ([`check_option`] knows it); `None` for a
/// flag an encode job may not use.
pub fn takes_value(flag: &str, input: bool) -> Option<bool> {
    let known = if input {
        matches!(flag, "-r" | "-framerate")
    } else {
        matches!(
            flag,
            "-c:v"
                | "-codec:v"
                | "-vcodec"
                | "-pix_fmt"
                | "-crf"
                | "-qp"
                | "-q:v"
                | "-preset"
                | "-tune"
                | "-b:v"
                | "-maxrate"
                | "-bufsize"
                | "-r"
                | "-g"
                | "-profile:v"
                | "-level"
                | "-movflags"
                | "-an"
        )
    };
    known.then_some(flag != "-an")
}

/// Checks one ffmpeg option of an encode job: its flag is one an encode
/// step uses and its value has that flag's shape (never a path).
pub fn check_option(flag: &str, value: Option<&str>, input: bool) -> Result<(), String> {
    let where_ = if input { "input" } else { "output" };
    let Some(wants_value) = takes_value(flag, input) else {
        return Err(format!(
            "`{flag}` is not an {where_} option an encode step may use"
        ));
    };
    let v = match (wants_value, value) {
        (false, None) => return Ok(()),
        (false, Some(v)) => return Err(format!("`{flag}` takes no value (got `{v}`)")),
        (true, None) => return Err(format!("`{flag}` needs a value")),
        (true, Some(v)) => v,
    };
    let word = |v: &str| {
        !v.is_empty()
            && v.len() <= 32
            && (v.bytes()).all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
            && !v.starts_with('-')
    };
    let ok = match flag {
        "-r" | "-framerate" => rate(v),
        "-c:v" | "-codec:v" | "-vcodec" => CODECS.contains(&v),
        "-crf" | "-qp" | "-q:v" => v.parse::<u32>().is_ok_and(|n| n <= 63),
        "-g" => v.parse::<u32>().is_ok_and(|n| (1..=10_000).contains(&n)),
        "-b:v" | "-maxrate" | "-bufsize" => bitrate(v),
        "-level" => v.len() <= 8 && v.bytes().all(|b| b.is_ascii_digit() || b == b'.'),
        "-movflags" => matches!(v, "+faststart" | "faststart"),
        _ => word(v),
    };
    if ok {
        Ok(())
    } else {
        Err(format!("`{flag} {v}`: not a value an encode step may give"))
    }
}

/// Checks a whole list of options (flag, then its value if it takes one).
pub fn check_options(options: &[String], input: bool) -> Result<(), String> {
    if options.len() > MAX_OPTIONS {
        return Err(format!(
            "{} ffmpeg options; at most {MAX_OPTIONS}",
            options.len()
        ));
    }
    let mut it = options.iter();
    while let Some(flag) = it.next() {
        let value = match takes_value(flag, input) {
            Some(true) => Some(
                it.next()
                    .map(String::as_str)
                    .ok_or_else(|| format!("`{flag}` needs a value"))?,
            ),
            _ => None,
        };
        check_option(flag, value, input)?;
    }
    Ok(())
}

/// A frame rate: `24`, `23.976` or `24000/1001`, above 0 and at most 1000.
fn rate(v: &str) -> bool {
    let n = |s: &str| {
        s.len() <= 12
            && s.bytes().all(|b| b.is_ascii_digit() || b == b'.')
            && s.parse::<f64>().is_ok_and(|x| x > 0.0 && x <= 1e6)
    };
    let value = match v.split_once('/') {
        Some((a, b)) if n(a) && n(b) => {
            a.parse::<f64>().unwrap_or(0.0) / b.parse::<f64>().unwrap_or(1.0)
        }
        Some(_) => return false,
        None if n(v) => v.parse::<f64>().unwrap_or(0.0),
        None => return false,
    };
    value > 0.0 && value <= 1000.0
}

/// A bit rate: digits with an optional `k`, `K`, `M` or `G`.
fn bitrate(v: &str) -> bool {
    let digits = v.trim_end_matches(['k', 'K', 'm', 'M', 'g', 'G']);
    !digits.is_empty()
        && digits.len() <= 12
        && digits.bytes().all(|b| b.is_ascii_digit())
        && v.len() - digits.len() <= 1
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(s: &str) -> Vec<String> {
        s.split_whitespace().map(str::to_string).collect()
    }

    #[test]
    fn an_encode_steps_options_pass_and_others_are_refused_by_name() {
        assert!(check_options(&opts("-framerate 24"), true).is_ok());
        assert!(check_options(&opts("-r 24000/1001"), true).is_ok());
        assert!(check_options(
            &opts("-c:v libx264 -pix_fmt yuv420p -crf 18 -preset slow -movflags +faststart -an"),
            false
        )
        .is_ok());
        let err = |s: &str, input| check_options(&opts(s), input).unwrap_err();
        assert!(err("-vf movie=/etc/passwd", false).contains("`-vf`"));
        assert!(err("-i other.png", true).contains("`-i`"));
        assert!(err("-c:v ../../x", false).contains("`-c:v ../../x`"));
        assert!(err("-r 0", true).contains("`-r 0`"));
        assert!(err("-pix_fmt", false).contains("needs a value"));
        assert!(err("-pix_fmt -y", false).contains("`-pix_fmt -y`"));
        assert!(err("-crf 99", false).contains("`-crf 99`"));
    }

    #[test]
    fn movie_names_are_plain_files_of_a_known_container() {
        assert!(check_movie_name("shot.mp4").is_ok());
        assert!(check_movie_name("a/shot.mp4").is_err());
        assert!(check_movie_name("shot.exe").unwrap_err().contains(".mp4"));
        assert!(check_movie_name(".mp4").is_err());
        assert_eq!(input_path(0, "jpg"), "frames/000001.jpg");
        assert_eq!(input_pattern("jpg"), "frames/%06d.jpg");
    }
}
