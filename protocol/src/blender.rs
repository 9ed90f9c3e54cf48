//! Which Blender a job needs and which Blenders a worker offers.
//!
//! A `.blend` file names the Blender that saved it in its first bytes
//! (`BLENDER-v405`: 4.5; Blender 5 writes `BLENDER17-01v0500`). A job asks
//! for a version ([`VersionReq`], by default the file's own major.minor) and
//! for features (denoising needs OpenImageDenoise, OSL shading needs OSL,
//! Eevee needs a GPU context); each worker reports, per Blender it offers, a
//! [`BlenderOffer`] saying what that build can do. Matching them is the
//! scheduler's business; these are the shared types.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// A Blender release. Ordered by (major, minor, patch).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, Default,
)]
pub struct BlenderVersion {
    pub major: u16,
    pub minor: u16,
    pub patch: u16,
}

impl BlenderVersion {
    pub fn new(major: u16, minor: u16, patch: u16) -> BlenderVersion {
        BlenderVersion {
            major,
            minor,
            patch,
        }
    }

    /// `4.5`: the part that decides whether a file can be read.
    pub fn series(self) -> (u16, u16) {
        (self.major, self.minor)
    }

    pub fn short(self) -> String {
        format!("{}.{}", self.major, self.minor)
    }
}

impl fmt::Display for BlenderVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
}

/// Why a `.blend` header could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HeaderError {
    #[error("it does not start with BLENDER")]
    NotBlend,
    #[error("unreadable .blend header {0:?}")]
    Malformed(String),
}

/// Bytes of the start of an (uncompressed) `.blend` that [`header_version`]
/// needs at most.
pub const HEADER_LEN: usize = 17;

/// The Blender that saved a `.blend`, from the first bytes of the
/// uncompressed file: `BLENDER` `_`/`-` `v`/`V` `NNN` (Blender 2.x to 4.x;
/// 405 is 4.5, 279 is 2.79), or `BLENDER` `SS` `-` `FF` `v`/`V` `NNNN`
/// (Blender 5: header size, format version, 0500 is 5.0). The patch level is
/// not in the header and reads as 0.
pub fn header_version(head: &[u8]) -> Result<BlenderVersion, HeaderError> {
    let rest = head.strip_prefix(b"BLENDER").ok_or(HeaderError::NotBlend)?;
    let bad = || {
        HeaderError::Malformed(String::from_utf8_lossy(&head[..head.len().min(HEADER_LEN)]).into())
    };
    let digits = |b: &[u8]| -> Option<u16> {
        if b.is_empty() || !b.iter().all(u8::is_ascii_digit) {
            return None;
        }
        std::str::from_utf8(b).ok()?.parse().ok()
    };
    let number = match rest {
        [b'_' | b'-', b'v' | b'V', v @ ..] if v.len() >= 3 => digits(&v[..3]).ok_or_else(bad)?,
        [s1, s2, b'-', f1, f2, b'v' | b'V', v @ ..]
            if v.len() >= 4 && digits(&[*s1, *s2]).is_some() && digits(&[*f1, *f2]).is_some() =>
        {
            digits(&v[..4]).ok_or_else(bad)?
        }
        _ => return Err(bad()),
    };
    Ok(BlenderVersion::new(number / 100, number % 100, 0))
}

/// Which Blender versions may render a job.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum VersionReq {
    /// This major.minor, any patch level: `4.5`.
    Series(u16, u16),
    /// This major.minor or newer: `>=4.2`.
    AtLeast(u16, u16),
}

impl VersionReq {
    pub fn matches(self, v: BlenderVersion) -> bool {
        match self {
            VersionReq::Series(ma, mi) => v.series() == (ma, mi),
            VersionReq::AtLeast(ma, mi) => v.series() >= (ma, mi),
        }
    }

    /// The lowest series it accepts.
    pub fn floor(self) -> (u16, u16) {
        match self {
            VersionReq::Series(ma, mi) | VersionReq::AtLeast(ma, mi) => (ma, mi),
        }
    }
}

impl fmt::Display for VersionReq {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            VersionReq::Series(ma, mi) => write!(f, "{ma}.{mi}"),
            VersionReq::AtLeast(ma, mi) => write!(f, ">={ma}.{mi}"),
        }
    }
}

impl FromStr for VersionReq {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let t = s.trim();
        let (at_least, v) = match t.strip_prefix(">=") {
            Some(v) => (true, v.trim()),
            None => (false, t),
        };
        let bad = || format!("`{s}` is not a Blender version: expected e.g. 4.5 or '>=4.2'");
        let mut parts = v.split('.');
        let mut next = || -> Result<u16, String> {
            let p = parts.next().ok_or_else(bad)?;
            match p.parse::<u16>() {
                Ok(n) if n < 100 && !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()) => Ok(n),
                _ => Err(bad()),
            }
        };
        let (ma, mi) = (next()?, next()?);
        // A patch level is allowed and ignored: files name only major.minor.
        if let Some(p) = parts.next() {
            if p.is_empty() || !p.bytes().all(|b| b.is_ascii_digit()) || p.len() > 4 {
                return Err(bad());
            }
        }
        if parts.next().is_some() || ma == 0 {
            return Err(bad());
        }
        Ok(if at_least {
            VersionReq::AtLeast(ma, mi)
        } else {
            VersionReq::Series(ma, mi)
        })
    }
}

/// What a Blender job needs of the Blender that renders it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct BlenderNeeds {
    /// The Blender that saved the file (from its header), if known. No
    /// Blender older than this ever gets the file, whatever `version` says.
    pub saved_by: Option<BlenderVersion>,
    pub version: VersionReq,
    /// Cycles denoising with OpenImageDenoise.
    pub denoise: bool,
    /// Cycles with Open Shading Language.
    pub osl: bool,
    /// Eevee or Workbench: needs a GPU (OpenGL/EGL) context without a display.
    pub eevee: bool,
}

impl BlenderNeeds {
    /// Why `offer` cannot render a job with `needs`, or `None` when it can.
    pub fn unmet(&self, offer: &BlenderOffer) -> Option<String> {
        let v = offer.version;
        if let Some(saved) = self.saved_by {
            // An older Blender may crash reading a newer file: never.
            if v.series() < saved.series() {
                return Some(format!(
                    "the file was saved by Blender {}; {} cannot read it",
                    saved.short(),
                    offer.name
                ));
            }
        }
        if !self.version.matches(v) {
            return Some(format!("needs Blender {}", self.version));
        }
        if self.denoise && !offer.oidn {
            return Some(format!(
                "denoising needs OpenImageDenoise; {} is built without it",
                offer.name
            ));
        }
        if self.osl && !offer.osl {
            return Some(format!(
                "OSL shading needs Cycles with OSL; {} is built without it",
                offer.name
            ));
        }
        if self.eevee && !offer.eevee {
            return Some(format!(
                "Eevee and Workbench need a GPU context; {} has none on its worker",
                offer.name
            ));
        }
        None
    }

    /// The index of the first of `offers` that can render a job with `needs`.
    pub fn pick(&self, offers: &[BlenderOffer]) -> Option<usize> {
        offers.iter().position(|o| self.unmet(o).is_none())
    }
}

/// One Blender a worker offers, and what it can do.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BlenderOffer {
    pub version: BlenderVersion,
    /// How people know this build, e.g. `Debian's Blender 3.4.1` or
    /// `Blender 4.5.4 LTS (bpy)`.
    pub name: String,
    /// Cycles device types built in (CUDA, OPTIX, HIP, ONEAPI, METAL).
    pub device_types: Vec<String>,
    /// Devices Cycles found on this machine, as `TYPE: name`.
    pub devices: Vec<String>,
    /// The Cycles device its slots render on (CPU, CUDA, OPTIX, ...).
    pub render_device: String,
    pub oidn: bool,
    pub osl: bool,
    pub eevee: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_of_every_generation_name_their_blender() {
        let v = |s: &[u8]| header_version(s);
        assert_eq!(v(b"BLENDER-v405REND"), Ok(BlenderVersion::new(4, 5, 0)));
        assert_eq!(v(b"BLENDER_v279"), Ok(BlenderVersion::new(2, 79, 0)));
        assert_eq!(v(b"BLENDER-V304"), Ok(BlenderVersion::new(3, 4, 0)));
        assert_eq!(v(b"BLENDER17-01v0500"), Ok(BlenderVersion::new(5, 0, 0)));
        assert_eq!(v(b"\x28\xb5\x2f\xfd"), Err(HeaderError::NotBlend));
        assert!(matches!(v(b"BLENDER-vx05"), Err(HeaderError::Malformed(_))));
        assert!(matches!(v(b"BLENDER-v4"), Err(HeaderError::Malformed(_))));
    }

    #[test]
    fn version_requests_parse_and_match() {
        let r = |s: &str| s.parse::<VersionReq>();
        assert_eq!(r("4.5"), Ok(VersionReq::Series(4, 5)));
        assert_eq!(r(">=4.2"), Ok(VersionReq::AtLeast(4, 2)));
        assert_eq!(r(" >= 4.2.3 "), Ok(VersionReq::AtLeast(4, 2)));
        for bad in [
            "", "4", "four.5", "4.5.x", "4.5.1.2", ">4.2", "0.1", "4.500",
        ] {
            assert!(
                r(bad).unwrap_err().contains("not a Blender version"),
                "{bad}"
            );
        }
        let v = BlenderVersion::new;
        assert!(VersionReq::Series(4, 5).matches(v(4, 5, 4)));
        assert!(!VersionReq::Series(4, 5).matches(v(4, 2, 9)));
        assert!(VersionReq::AtLeast(4, 2).matches(v(5, 0, 1)));
        assert!(!VersionReq::AtLeast(4, 2).matches(v(3, 4, 1)));
        assert_eq!(VersionReq::AtLeast(4, 2).to_string(), ">=4.2");
    }
}

/// An image format a job's frames may be written in instead of the
/// `.blend` file's own (an OpenJD template's `--render-format`), by
/// Blender's own name for it (`image_settings.file_format`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ImageFormat {
    #[serde(rename = "JPEG")]
    Jpeg,
    #[serde(rename = "PNG")]
    Png,
    #[serde(rename = "OPEN_EXR")]
    OpenExr,
}

impl ImageFormat {
    pub const ALL: [ImageFormat; 3] = [ImageFormat::Jpeg, ImageFormat::Png, ImageFormat::OpenExr];

    /// Blender's name (`JPEG`, `PNG`, `OPEN_EXR`).
    pub fn blender_name(self) -> &'static str {
        match self {
            ImageFormat::Jpeg => "JPEG",
            ImageFormat::Png => "PNG",
            ImageFormat::OpenExr => "OPEN_EXR",
        }
    }

    /// How the farm collects frames of this format: PNG and OpenEXR
    /// tiles are stitched; a JPEG is any image, whole frames only.
    pub fn output(self) -> crate::job::OutputFormat {
        match self {
            ImageFormat::Jpeg => crate::job::OutputFormat::Image,
            ImageFormat::Png => crate::job::OutputFormat::Png,
            ImageFormat::OpenExr => crate::job::OutputFormat::Exr,
        }
    }
}

impl fmt::Display for ImageFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.blender_name())
    }
}

impl FromStr for ImageFormat {
    type Err = String;

    /// Blender's name, as `blender --render-format` takes it.
    fn from_str(s: &str) -> Result<ImageFormat, String> {
        (ImageFormat::ALL.into_iter())
            .find(|f| f.blender_name() == s.trim())
            .ok_or_else(|| {
                format!("`{s}` is not a format Tessera writes frames in: JPEG, PNG or OPEN_EXR")
            })
    }
}
