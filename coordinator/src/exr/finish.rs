//! A finished multilayer OpenEXR frame. Its finishing task composites and
//! denoises the whole frame in Blender, but the finishing step renders
//! nothing, and Blender writes into a multilayer file only what the step
//! made: the Composite layer and each denoised view layer's Combined pass.
//! Its output holds those, and names in [`PLAN_ATTRIBUTE`] how the frame's
//! stitched passes complete it into the file Blender's own render writes:
//! every pass of every view layer from the stitched passes, the finished
//! channels in place of theirs, each denoised layer's noisy Combined as
//! its `Noisy Image`, without the denoising data the tiles kept only for
//! the finishing step; in the scene's codec and precision, with the
//! stitched passes' metadata (Blender's stamp of the tiles' render).

use std::collections::{BTreeMap, BTreeSet};
use std::result::Result;

use exr::meta::attribute::{AttributeValue, Text};
use exr::prelude::*;
use serde::Deserialize;

use super::{compression, read_layer, ExrLayer, CODEC_ATTRIBUTE};
use crate::stitch::StitchError;

/// The header attribute (a JSON [`Plan`]) of a finishing task's output
/// that is completed with its frame's stitched passes.
pub const PLAN_ATTRIBUTE: &str = "tessera.finish";

/// The most bytes a plan may take.
const MAX_PLAN: usize = 64 << 10;

/// The largest finite half float; Blender clamps to it when it writes half.
const HALF_MAX: f32 = 65504.0;

/// How the stitched passes complete a finishing task's output.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Plan {
    /// The scene's codec, as Blender names it (`ZIP`, `PIZ`, `DWAA`, …).
    codec: String,
    /// The scene writes half floats (colour depth 16): Blender then writes
    /// its RGB(A) passes as half and every other pass as float.
    half: bool,
    /// Passes (`ViewLayer.Denoising Normal`) the tiles stored for the
    /// finishing step that the scene's own render does not write.
    #[serde(default)]
    drop: Vec<String>,
    /// View layers Blender denoises: their noisy Combined, stitched, is
    /// also their `Noisy Image` pass.
    #[serde(default)]
    noisy: Vec<String>,
}

/// Whether `finished` (a finishing task's output) is completed with its
/// frame's stitched passes, read from its header alone.
pub fn needs_passes(finished: &[u8]) -> bool {
    if !super::is_exr(finished) {
        return false;
    }
    exr::meta::MetaData::read_from_buffered(std::io::Cursor::new(finished), false).is_ok_and(
        |meta| {
            (meta.headers.first())
                .is_some_and(|h| (h.own_attributes.other).contains_key(&Text::from(PLAN_ATTRIBUTE)))
        },
    )
}

/// The frame: `finished` (a finishing task's output carrying a plan)
/// completed with `passes` (the frame's stitched passes), as the module
/// says.
pub fn complete(passes: &[u8], finished: &[u8]) -> Result<Vec<u8>, StitchError> {
    let stitched = read_layer(0, passes)?;
    let mut done = read_layer(1, finished)?;
    let plan = take_plan(&mut done)?;
    if done.size != stitched.size {
        return Err(StitchError::WrongSize {
            index: 1,
            got_w: done.size.0 as u32,
            got_h: done.size.1 as u32,
            want_w: stitched.size.0 as u32,
            want_h: stitched.size.1 as u32,
        });
    }
    let dropped: BTreeSet<&[u8]> = plan.drop.iter().map(|p| p.as_bytes()).collect();
    let noisy: BTreeSet<Vec<u8>> = (plan.noisy.iter())
        .map(|l| format!("{l}.Combined").into_bytes())
        .collect();
    // By name: the stitched passes, their noisy copies, then the finished
    // channels over them.
    let mut channels: BTreeMap<Vec<u8>, AnyChannel<FlatSamples>> = BTreeMap::new();
    for channel in stitched.channel_data.list {
        let name = channel.name.as_slice().to_vec();
        let (pass, id) = split_channel(&name);
        if dropped.contains(pass) {
            continue;
        }
        if noisy.contains(pass) {
            let layer = &pass[..pass.len() - b"Combined".len()];
            let copy = [layer, b"Noisy Image.", id].concat();
            let mut noisy_image = channel.clone();
            noisy_image.name = Text::from_slice_unchecked(&copy);
            channels.insert(copy, noisy_image);
        }
        channels.insert(name, channel);
    }
    for channel in done.channel_data.list {
        channels.insert(channel.name.as_slice().to_vec(), channel);
    }
    let mut channels: Vec<_> = channels.into_values().collect();
    if plan.half {
        to_half_as_blender_writes(&mut channels);
    }
    let mut attributes = stitched.attributes;
    attributes.other.remove(&Text::from(CODEC_ATTRIBUTE));
    attributes.other.remove(&Text::from(PLAN_ATTRIBUTE));
    attributes.layer_position = Vec2(0, 0);
    let encoding = Encoding {
        compression: compression(&plan.codec),
        blocks: Blocks::ScanLines,
        line_order: LineOrder::Increasing,
    };
    let layer = Layer::new(
        stitched.size,
        attributes,
        encoding,
        AnyChannels::sort(channels.into_iter().collect()),
    );
    let mut out = std::io::Cursor::new(Vec::new());
    Image::from_layer(layer)
        .write()
        .to_buffered(&mut out)
        .map_err(|e| StitchError::Encode(e.to_string()))?;
    Ok(out.into_inner())
}

/// Takes the plan (and the codec attribute) out of the finishing task's
/// output.
fn take_plan(done: &mut ExrLayer) -> Result<Plan, StitchError> {
    let bad = |reason: String| StitchError::BadTile { index: 1, reason };
    let other = &mut done.attributes.other;
    other.remove(&Text::from(CODEC_ATTRIBUTE));
    let Some(AttributeValue::Text(json)) = other.remove(&Text::from(PLAN_ATTRIBUTE)) else {
        return Err(bad(format!(
            "the finished frame has no {PLAN_ATTRIBUTE} text"
        )));
    };
    if json.as_slice().len() > MAX_PLAN {
        return Err(bad(format!(
            "its {PLAN_ATTRIBUTE} takes {} bytes, more than {MAX_PLAN}",
            json.as_slice().len()
        )));
    }
    serde_json::from_slice(json.as_slice()).map_err(|e| bad(format!("its {PLAN_ATTRIBUTE}: {e}")))
}

/// A channel's pass and channel id: `ViewLayer.Depth` and `Z` of
/// `ViewLayer.Depth.Z` (a view layer's name may hold dots).
fn split_channel(name: &[u8]) -> (&[u8], &[u8]) {
    match name.iter().rposition(|&b| b == b'.') {
        Some(dot) => (&name[..dot], &name[dot + 1..]),
        None => (&[], name),
    }
}

/// Writes as half the channels Blender writes as half in a half-float
/// multilayer file: those of passes whose channels are RGB, RGBA or one
/// colour (`BKE_image_render_write_exr`: "We only store RGBA passes as half
/// float, for others precision loss can be problematic"), clamped to the
/// largest half as Blender clamps them.
fn to_half_as_blender_writes(channels: &mut [AnyChannel<FlatSamples>]) {
    let mut ids: BTreeMap<Vec<u8>, BTreeSet<u8>> = BTreeMap::new();
    for c in channels.iter() {
        let (pass, id) = split_channel(c.name.as_slice());
        let entry = ids.entry(pass.to_vec()).or_default();
        entry.insert(if id.len() == 1 { id[0] } else { 0 });
    }
    let colour = |set: &BTreeSet<u8>| {
        let rgb = [b'R', b'G', b'B'].iter().all(|c| set.contains(c));
        set.iter().all(|c| b"RGBA".contains(c)) && (set.len() == 1 || (rgb && set.len() >= 3))
    };
    for c in channels.iter_mut() {
        let (pass, _) = split_channel(c.name.as_slice());
        if !ids.get(pass).is_some_and(colour) {
            continue;
        }
        if let FlatSamples::F32(v) = &c.sample_data {
            let half = v
                .iter()
                .map(|x| f16::from_f32(x.clamp(-HALF_MAX, HALF_MAX)))
                .collect();
            c.sample_data = FlatSamples::F16(half);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A single-part EXR of float channels `(name, value)`, `w` x `h`, with
    /// the string attributes `attrs`.
    fn exr(w: usize, h: usize, channels: &[(&str, f32)], attrs: &[(&str, &str)]) -> Vec<u8> {
        let mut attributes = LayerAttributes::default();
        for (k, v) in attrs {
            attributes
                .other
                .insert(Text::from(*k), AttributeValue::Text(Text::from(*v)));
        }
        let list = (channels.iter())
            .map(|(n, v)| AnyChannel::new(*n, FlatSamples::F32(vec![*v; w * h])))
            .collect();
        let layer = Layer::new(
            (w, h),
            attributes,
            Encoding::UNCOMPRESSED,
            AnyChannels::sort(list),
        );
        let mut out = std::io::Cursor::new(Vec::new());
        Image::from_layer(layer)
            .write()
            .to_buffered(&mut out)
            .unwrap();
        out.into_inner()
    }

    #[test]
    fn the_finished_channels_complete_the_stitched_passes_as_blender_writes_them() {
        let rgba = |p: &str, v: f32| ["R", "G", "B", "A"].map(|c| (format!("{p}.{c}"), v));
        let mut stitched: Vec<(String, f32)> = Vec::new();
        stitched.extend(rgba("View.Layer.Combined", 1.5));
        stitched.extend(rgba("Second.Combined", 2.5));
        stitched.extend(rgba("View.Layer.CryptoObject00", 0.25));
        stitched.extend(["X", "Y", "Z"].map(|c| (format!("View.Layer.Denoising Normal.{c}"), 0.5)));
        stitched.extend(["R", "G", "B"].map(|c| (format!("View.Layer.Denoising Albedo.{c}"), 0.5)));
        stitched.push(("View.Layer.Depth.Z".into(), 70000.0));
        let named: Vec<(&str, f32)> = stitched.iter().map(|(n, v)| (n.as_str(), *v)).collect();
        let passes = exr(
            4,
            3,
            &named,
            &[("Frame", "7"), ("cycles.View.Layer.samples", "16")],
        );
        let plan = r#"{"codec":"PIZ","half":true,"drop":["View.Layer.Denoising Normal","View.Layer.Denoising Albedo"],"noisy":["View.Layer"]}"#;
        let mut made: Vec<(String, f32)> = Vec::new();
        made.extend(rgba("View.Layer.Combined", 1.0));
        made.extend(rgba("Composite.Combined", 80000.0));
        let named: Vec<(&str, f32)> = made.iter().map(|(n, v)| (n.as_str(), *v)).collect();
        let finished = exr(4, 3, &named, &[(PLAN_ATTRIBUTE, plan), ("Frame", "7")]);
        assert!(needs_passes(&finished) && !needs_passes(&passes));

        let frame = complete(&passes, &finished).unwrap();
        let layer = read_layer(0, &frame).unwrap();
        assert_eq!(
            layer.encoding.compression,
            exr::compression::Compression::PIZ
        );
        let other = &layer.attributes.other;
        assert!(other.contains_key(&Text::from("cycles.View.Layer.samples")));
        assert!(!other.contains_key(&Text::from(PLAN_ATTRIBUTE)));
        let got: Vec<(String, &str, f32)> = (layer.channel_data.list.iter())
            .map(|c| {
                let (kind, first) = match &c.sample_data {
                    FlatSamples::F16(v) => ("half", v[0].to_f32()),
                    FlatSamples::F32(v) => ("float", v[0]),
                    FlatSamples::U32(_) => unreachable!(),
                };
                (c.name.to_string(), kind, first)
            })
            .collect();
        let want: Vec<(String, &str, f32)> = [
            rgba("Composite.Combined", HALF_MAX).map(|(n, v)| (n, "half", v)),
            rgba("Second.Combined", 2.5).map(|(n, v)| (n, "half", v)),
            rgba("View.Layer.Combined", 1.0).map(|(n, v)| (n, "half", v)),
            rgba("View.Layer.CryptoObject00", 0.25).map(|(n, v)| (n, "half", v)),
            rgba("View.Layer.Noisy Image", 1.5).map(|(n, v)| (n, "half", v)),
        ]
        .into_iter()
        .flatten()
        .chain([("View.Layer.Depth.Z".to_string(), "float", 70000.0)])
        .collect();
        let mut want = want;
        want.sort_by(|a, b| a.0.cmp(&b.0));
        assert_eq!(got, want);

        // A plan that is not one is refused, naming it.
        let bad = exr(
            4,
            3,
            &[("Composite.Combined.R", 1.0)],
            &[(PLAN_ATTRIBUTE, "{")],
        );
        let err = complete(&passes, &bad).unwrap_err().to_string();
        assert!(err.contains(PLAN_ATTRIBUTE), "{err}");
        // So is a finished frame of another size.
        let small = exr(
            2,
            3,
            &[("Composite.Combined.R", 1.0)],
            &[(PLAN_ATTRIBUTE, plan)],
        );
        assert!(matches!(
            complete(&passes, &small),
            Err(StitchError::WrongSize { .. })
        ));
    }
}
