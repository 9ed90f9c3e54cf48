//! OpenEXR frames. `encode_rgba_f32` writes merged 4-channel float ranges
//! (32-bit float RGBA, uncompressed); `stitch_layers` merges the sample
//! ranges and stitches the tiles that carry every channel of the scene's
//! OpenEXR output (all view layers, passes and Cryptomatte layers, each in
//! its own precision) with the `exr` crate, and writes the scene's codec and
//! metadata. `finish` completes a finished multilayer frame with its
//! stitched passes.

pub mod finish;

/// Encodes `rgba` (width × height × 4 floats, rows top to bottom) as EXR.
pub fn encode_rgba_f32(width: u32, height: u32, rgba: &[f32]) -> Vec<u8> {
    assert_eq!(
        rgba.len(),
        width as usize * height as usize * 4,
        "pixel buffer size"
    );
    let mut out = Vec::with_capacity(rgba.len() * 4 + 512 + height as usize * 8);
    out.extend_from_slice(&[0x76, 0x2f, 0x31, 0x01]); // magic
    out.extend_from_slice(&2u32.to_le_bytes()); // version 2, scanline, single part
    let mut chlist = Vec::new();
    // Channels must be listed in alphabetical order: A, B, G, R.
    for name in ["A", "B", "G", "R"] {
        chlist.extend_from_slice(name.as_bytes());
        chlist.push(0);
        chlist.extend_from_slice(&2i32.to_le_bytes()); // pixel type FLOAT
        chlist.extend_from_slice(&[0, 0, 0, 0]); // pLinear + reserved
        chlist.extend_from_slice(&1i32.to_le_bytes()); // x sampling
        chlist.extend_from_slice(&1i32.to_le_bytes()); // y sampling
    }
    chlist.push(0);
    let window = {
        let mut b = Vec::new();
        for v in [0i32, 0, width as i32 - 1, height as i32 - 1] {
            b.extend_from_slice(&v.to_le_bytes());
        }
        b
    };
    attribute(&mut out, "channels", "chlist", &chlist);
    attribute(&mut out, "compression", "compression", &[0]); // NO_COMPRESSION
    attribute(&mut out, "dataWindow", "box2i", &window);
    attribute(&mut out, "displayWindow", "box2i", &window);
    attribute(&mut out, "lineOrder", "lineOrder", &[0]); // INCREASING_Y
    attribute(&mut out, "pixelAspectRatio", "float", &1f32.to_le_bytes());
    attribute(&mut out, "screenWindowCenter", "v2f", &[0u8; 8]);
    attribute(&mut out, "screenWindowWidth", "float", &1f32.to_le_bytes());
    out.push(0); // end of header

    let line_bytes = width as usize * 4 * 4;
    let block = 8 + line_bytes;
    let table_end = out.len() + height as usize * 8;
    for y in 0..height as usize {
        out.extend_from_slice(&((table_end + y * block) as u64).to_le_bytes());
    }
    let w = width as usize;
    for y in 0..height as usize {
        out.extend_from_slice(&(y as i32).to_le_bytes());
        out.extend_from_slice(&(line_bytes as i32).to_le_bytes());
        let row = &rgba[y * w * 4..(y + 1) * w * 4];
        for channel in [3, 2, 1, 0] {
            for x in 0..w {
                out.extend_from_slice(&row[x * 4 + channel].to_le_bytes());
            }
        }
    }
    out
}

fn attribute(out: &mut Vec<u8>, name: &str, kind: &str, value: &[u8]) {
    out.extend_from_slice(name.as_bytes());
    out.push(0);
    out.extend_from_slice(kind.as_bytes());
    out.push(0);
    out.extend_from_slice(&(value.len() as i32).to_le_bytes());
    out.extend_from_slice(value);
}

/// Reads back an image written by [`encode_rgba_f32`] (uncompressed float
/// RGBA only). Returns width, height and RGBA rows top to bottom.
pub fn decode_rgba_f32(bytes: &[u8]) -> Option<(u32, u32, Vec<f32>)> {
    if bytes.get(..4)? != [0x76, 0x2f, 0x31, 0x01] {
        return None;
    }
    let mut pos = 8;
    let mut window = None;
    let mut channels = Vec::new();
    loop {
        let name_end = pos + bytes[pos..].iter().position(|&b| b == 0)?;
        if name_end == pos {
            pos += 1;
            break;
        }
        let name = std::str::from_utf8(&bytes[pos..name_end]).ok()?;
        let kind_end = name_end + 1 + bytes[name_end + 1..].iter().position(|&b| b == 0)?;
        let size =
            i32::from_le_bytes(bytes.get(kind_end + 1..kind_end + 5)?.try_into().ok()?) as usize;
        let value = bytes.get(kind_end + 5..kind_end + 5 + size)?;
        match name {
            "dataWindow" => {
                let v: Vec<i32> = value
                    .chunks(4)
                    .map(|c| i32::from_le_bytes(c.try_into().unwrap()))
                    .collect();
                window = Some(((v[2] - v[0] + 1) as u32, (v[3] - v[1] + 1) as u32));
            }
            "compression" if value != [0] => return None,
            "channels" => {
                let mut p = 0;
                while value[p] != 0 {
                    let end = p + value[p..].iter().position(|&b| b == 0)?;
                    channels.push(String::from_utf8(value[p..end].to_vec()).ok()?);
                    p = end + 1 + 16;
                }
            }
            _ => {}
        }
        pos = kind_end + 5 + size;
    }
    let (w, h) = window?;
    if channels != ["A", "B", "G", "R"] {
        return None;
    }
    pos += h as usize * 8;
    let mut rgba = vec![0f32; w as usize * h as usize * 4];
    for _ in 0..h {
        let y = i32::from_le_bytes(bytes.get(pos..pos + 4)?.try_into().ok()?) as usize;
        pos += 8;
        for channel in [3, 2, 1, 0] {
            for x in 0..w as usize {
                let v = f32::from_le_bytes(bytes.get(pos..pos + 4)?.try_into().ok()?);
                rgba[(y * w as usize + x) * 4 + channel] = v;
                pos += 4;
            }
        }
    }
    Some((w, h, rgba))
}

/// The header attribute in which a worker names the codec the scene's
/// OpenEXR output uses (its float tiles travel uncompressed).
pub const CODEC_ATTRIBUTE: &str = "tessera.compression";

/// Whether `bytes` start like an OpenEXR file.
pub fn is_exr(bytes: &[u8]) -> bool {
    bytes.get(..4) == Some(&[0x76, 0x2f, 0x31, 0x01][..])
}

/// Blender's codec name as the `exr` crate's compression; codecs that crate
/// cannot write (DWAA, DWAB) fall back to lossless ZIP.
fn compression(name: &str) -> exr::compression::Compression {
    use exr::compression::Compression as C;
    match name {
        "NONE" => C::Uncompressed,
        "RLE" => C::RLE,
        "ZIPS" => C::ZIP1,
        "PIZ" => C::PIZ,
        "PXR24" => C::PXR24,
        "B44" => C::B44,
        "B44A" => C::B44A,
        _ => C::ZIP16,
    }
}

type ExrLayer = exr::image::Layer<exr::image::AnyChannels<exr::image::FlatSamples>>;

fn read_layer(index: usize, bytes: &[u8]) -> Result<ExrLayer, crate::stitch::StitchError> {
    use exr::prelude::*;
    let image = read()
        .no_deep_data()
        .largest_resolution_level()
        .all_channels()
        .first_valid_layer()
        .all_attributes()
        .from_buffered(std::io::Cursor::new(bytes))
        .map_err(|e| crate::stitch::StitchError::BadTile {
            index,
            reason: e.to_string(),
        })?;
    Ok(image.layer_data)
}

/// Merges the sample ranges of one tile, `weights` being each range's
/// sample count: every float channel becomes the sample-weighted mean of
/// its ranges, which is the mean over all samples up to float rounding.
/// One range is kept as it is. Passes Cycles takes from the first sample
/// alone (see [`one_sample_pass`]) and integer channels (Blender writes
/// none) keep the first range's samples, the range holding sample 0;
/// Cryptomatte's (id, coverage) pairs are averaged like any float, so they
/// are not exact.
fn merge_ranges(
    index: usize,
    parts: &[Vec<u8>],
    weights: &[u32],
) -> Result<ExrLayer, crate::stitch::StitchError> {
    use crate::stitch::StitchError;
    use exr::prelude::{f16, FlatSamples};
    let mut layers = (parts.iter())
        .map(|p| read_layer(index, p))
        .collect::<Result<Vec<_>, _>>()?;
    if layers.len() != weights.len() || layers.is_empty() {
        return Err(StitchError::BadTile {
            index,
            reason: format!("{} sample ranges, expected {}", layers.len(), weights.len()),
        });
    }
    let mut first = layers.remove(0);
    if layers.is_empty() {
        return Ok(first);
    }
    for other in &layers {
        let (a, b) = (&first.channel_data.list, &other.channel_data.list);
        if other.size != first.size
            || a.len() != b.len()
            || a.iter().zip(b).any(|(x, y)| x.name != y.name)
        {
            return Err(StitchError::MixedFormats { index });
        }
    }
    let total: f64 = weights.iter().map(|&n| f64::from(n)).sum();
    let w = |i: usize| f64::from(weights[i]) / total;
    for (c, channel) in first.channel_data.list.iter_mut().enumerate() {
        if one_sample_pass(&channel.name.to_string()) {
            continue;
        }
        let len = channel.sample_data.len();
        let mut sum: Vec<f64> = vec![0.0; len];
        let mut add = |data: &FlatSamples, k: usize| -> Result<(), StitchError> {
            match data {
                FlatSamples::F16(v) => {
                    (sum.iter_mut().zip(v)).for_each(|(s, x)| *s += x.to_f64() * w(k))
                }
                FlatSamples::F32(v) => {
                    (sum.iter_mut().zip(v)).for_each(|(s, x)| *s += f64::from(*x) * w(k))
                }
                FlatSamples::U32(_) => {}
            }
            (data.len() == len)
                .then_some(())
                .ok_or(StitchError::MixedFormats { index })
        };
        add(&channel.sample_data, 0)?;
        for (k, other) in layers.iter().enumerate() {
            let data = &other.channel_data.list[c].sample_data;
            if std::mem::discriminant(data) != std::mem::discriminant(&channel.sample_data) {
                return Err(StitchError::MixedFormats { index });
            }
            add(data, k + 1)?;
        }
        match &mut channel.sample_data {
            FlatSamples::F16(v) => {
                (v.iter_mut().zip(&sum)).for_each(|(x, s)| *x = f16::from_f64(*s))
            }
            FlatSamples::F32(v) => (v.iter_mut().zip(&sum)).for_each(|(x, s)| *x = *s as f32),
            FlatSamples::U32(_) => {}
        }
    }
    Ok(first)
}

/// Stitches OpenEXR tiles carrying every channel (every view layer, pass
/// and Cryptomatte layer, each in its own precision) into one frame, sample
/// for sample, and writes it with the codec the tiles name and the first
/// tile's metadata (Blender's stamp). Each tile comes as its sample ranges,
/// `weights` giving each range's samples; ranges are merged first (see
/// [`merge_ranges`]), and the stamp then names all `weights`' samples.
pub fn stitch_layers(
    width: u32,
    height: u32,
    tiles: &[(tessera_protocol::job::TileRect, Vec<Vec<u8>>)],
    weights: &[u32],
) -> Result<Vec<u8>, crate::stitch::StitchError> {
    use crate::stitch::StitchError;
    use exr::prelude::*;
    let (w, h) = (width as usize, height as usize);
    let mut frame: Option<(LayerAttributes, Vec<AnyChannel<FlatSamples>>, String)> = None;
    for (index, (rect, parts)) in tiles.iter().enumerate() {
        let layer = merge_ranges(index, parts, weights)?;
        let (tw, th) = (layer.size.0, layer.size.1);
        if (tw, th) != (rect.width as usize, rect.height as usize) {
            return Err(StitchError::WrongSize {
                index,
                got_w: tw as u32,
                got_h: th as u32,
                want_w: rect.width,
                want_h: rect.height,
            });
        }
        let (_, channels, _) = frame.get_or_insert_with(|| {
            let mut attributes = layer.attributes.clone();
            let codec = attributes
                .other
                .remove(&Text::from(CODEC_ATTRIBUTE))
                .and_then(|v| match v {
                    exr::meta::attribute::AttributeValue::Text(t) => Some(t.to_string()),
                    _ => None,
                })
                .unwrap_or_else(|| "ZIP".into());
            if weights.len() > 1 {
                stamp_samples(&mut attributes, weights.iter().sum());
            }
            attributes.layer_position = Vec2(0, 0);
            let channels = layer
                .channel_data
                .list
                .iter()
                .map(|c| {
                    let samples = match &c.sample_data {
                        FlatSamples::F16(_) => FlatSamples::F16(vec![f16::ZERO; w * h]),
                        FlatSamples::F32(_) => FlatSamples::F32(vec![0.0; w * h]),
                        FlatSamples::U32(_) => FlatSamples::U32(vec![0; w * h]),
                    };
                    let mut channel = c.clone();
                    channel.sample_data = samples;
                    channel
                })
                .collect();
            (attributes, channels, codec)
        });
        let list = &layer.channel_data.list;
        if list.len() != channels.len()
            || list
                .iter()
                .zip(channels.iter())
                .any(|(a, b)| a.name != b.name)
        {
            return Err(StitchError::MixedFormats { index });
        }
        for (src, dst) in list.iter().zip(channels.iter_mut()) {
            for row in 0..th {
                let from = row * tw;
                let to = (rect.y as usize + row) * w + rect.x as usize;
                match (&src.sample_data, &mut dst.sample_data) {
                    (FlatSamples::F16(s), FlatSamples::F16(d)) => {
                        d[to..to + tw].copy_from_slice(&s[from..from + tw])
                    }
                    (FlatSamples::F32(s), FlatSamples::F32(d)) => {
                        d[to..to + tw].copy_from_slice(&s[from..from + tw])
                    }
                    (FlatSamples::U32(s), FlatSamples::U32(d)) => {
                        d[to..to + tw].copy_from_slice(&s[from..from + tw])
                    }
                    _ => return Err(StitchError::MixedFormats { index }),
                }
            }
        }
    }
    let (attributes, channels, codec) =
        frame.ok_or_else(|| StitchError::Encode("a frame needs at least one tile".into()))?;
    let encoding = Encoding {
        compression: compression(&codec),
        blocks: Blocks::ScanLines,
        line_order: LineOrder::Increasing,
    };
    let layer = Layer::new(
        (w, h),
        attributes,
        encoding,
        AnyChannels::sort(channels.into_iter().collect()),
    );
    let image = Image::from_layer(layer);
    let mut out = std::io::Cursor::new(Vec::new());
    image
        .write()
        .to_buffered(&mut out)
        .map_err(|e| StitchError::Encode(e.to_string()))?;
    Ok(out.into_inner())
}

/// Passes that hold the first sample only, not a mean over samples:
/// Cycles writes depth and the object and material indices from sample 0
/// (Blender's manual: "The Z pass only uses one sample"), so a merged
/// frame takes them from the range that starts there. `View.Depth.Z`, or
/// `Z` in a single-layer OpenEXR.
fn one_sample_pass(channel: &str) -> bool {
    let mut parts = channel.rsplit('.');
    let last = parts.next().unwrap_or_default();
    match parts.next() {
        Some(pass) => matches!(pass, "Depth" | "IndexOB" | "IndexMA" | "Denoising Depth"),
        None => last == "Z",
    }
}

/// Blender stamps each view layer's Cycles samples (`cycles.View.samples`);
/// a frame merged from sample ranges says how many it holds in all.
fn stamp_samples(attributes: &mut exr::meta::header::LayerAttributes, samples: u32) {
    use exr::meta::attribute::{AttributeValue, Text};
    for (key, value) in attributes.other.iter_mut() {
        let key = key.to_string();
        if key.starts_with("cycles.") && key.ends_with(".samples") {
            *value = AttributeValue::Text(Text::from(samples.to_string().as_str()));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_keeps_every_float() {
        let (w, h) = (7, 3);
        let rgba: Vec<f32> = (0..w * h * 4).map(|i| i as f32 * 0.37 - 3.0).collect();
        let bytes = encode_rgba_f32(w, h, &rgba);
        assert_eq!(&bytes[..4], &[0x76, 0x2f, 0x31, 0x01]);
        assert_eq!(decode_rgba_f32(&bytes), Some((w, h, rgba)));
    }

    #[test]
    fn layer_tiles_stitch_every_channel_exactly_with_the_named_codec() {
        use ::exr::prelude::*;
        use tessera_protocol::job::{TileGrid, TileRect};
        let (w, h) = (7usize, 5usize);
        let half = |x: usize, y: usize| f16::from_f32((x * 10 + y) as f32 * 0.125);
        let full = |x: usize, y: usize| (x * 100 + y) as f32 * 1.000_1;
        let tile = |r: TileRect| {
            let (tw, th) = (r.width as usize, r.height as usize);
            let at = |i: usize| (r.x as usize + i % tw, r.y as usize + i / tw);
            let z: Vec<f32> = (0..tw * th).map(|i| full(at(i).0, at(i).1)).collect();
            let c: Vec<f16> = (0..tw * th).map(|i| half(at(i).0, at(i).1)).collect();
            let mut attributes = LayerAttributes::default();
            attributes.other.insert(
                Text::from(CODEC_ATTRIBUTE),
                ::exr::meta::attribute::AttributeValue::Text(Text::from("PIZ")),
            );
            attributes.other.insert(
                Text::from("Frame"),
                ::exr::meta::attribute::AttributeValue::Text(Text::from("3")),
            );
            let layer = Layer::new(
                (tw, th),
                attributes,
                Encoding::UNCOMPRESSED,
                AnyChannels::sort(
                    vec![
                        AnyChannel::new("View.Depth.Z", FlatSamples::F32(z)),
                        AnyChannel::new("View.Combined.R", FlatSamples::F16(c)),
                    ]
                    .into_iter()
                    .collect(),
                ),
            );
            let mut out = std::io::Cursor::new(Vec::new());
            Image::from_layer(layer)
                .write()
                .to_buffered(&mut out)
                .unwrap();
            out.into_inner()
        };
        let grid = TileGrid { cols: 2, rows: 2 };
        let tiles: Vec<_> = (0..grid.count())
            .map(|i| {
                let r = grid.rect(i, w as u32, h as u32);
                (r, vec![tile(r)])
            })
            .collect();
        let frame = stitch_layers(w as u32, h as u32, &tiles, &[16]).unwrap();
        assert!(is_exr(&frame));
        let image = read()
            .no_deep_data()
            .largest_resolution_level()
            .all_channels()
            .first_valid_layer()
            .all_attributes()
            .from_buffered(std::io::Cursor::new(frame))
            .unwrap();
        let layer = image.layer_data;
        assert_eq!(
            layer.encoding.compression,
            ::exr::compression::Compression::PIZ
        );
        assert!(layer.attributes.other.contains_key(&Text::from("Frame")));
        assert!(!layer
            .attributes
            .other
            .contains_key(&Text::from(CODEC_ATTRIBUTE)));
        for c in &layer.channel_data.list {
            match &c.sample_data {
                FlatSamples::F16(v) => {
                    assert_eq!(c.name.to_string(), "View.Combined.R");
                    let want: Vec<f16> = (0..w * h).map(|i| half(i % w, i / w)).collect();
                    assert_eq!(v, &want);
                }
                FlatSamples::F32(v) => {
                    let want: Vec<f32> = (0..w * h).map(|i| full(i % w, i / w)).collect();
                    assert_eq!(v, &want);
                }
                FlatSamples::U32(_) => unreachable!(),
            }
        }
    }

    /// A tile of two passes, `View.Depth.Z` (f32) and `View.Combined.R`
    /// (f16), set to `value` everywhere, stamped with `samples`.
    fn flat_tile(w: usize, h: usize, value: f32, samples: &str) -> Vec<u8> {
        use ::exr::meta::attribute::AttributeValue;
        use ::exr::prelude::*;
        let mut attributes = LayerAttributes::default();
        attributes.other.insert(
            Text::from(CODEC_ATTRIBUTE),
            AttributeValue::Text(Text::from("ZIP")),
        );
        attributes.other.insert(
            Text::from("cycles.View.samples"),
            AttributeValue::Text(Text::from(samples)),
        );
        let channels = vec![
            AnyChannel::new("View.Depth.Z", FlatSamples::F32(vec![value; w * h])),
            AnyChannel::new(
                "View.Combined.R",
                FlatSamples::F16(vec![f16::from_f32(value); w * h]),
            ),
        ];
        let layer = Layer::new(
            (w, h),
            attributes,
            Encoding::UNCOMPRESSED,
            AnyChannels::sort(channels.into_iter().collect()),
        );
        let mut out = std::io::Cursor::new(Vec::new());
        Image::from_layer(layer)
            .write()
            .to_buffered(&mut out)
            .unwrap();
        out.into_inner()
    }

    #[test]
    fn layer_ranges_merge_every_channel_by_sample_weight_and_stamp_the_total() {
        use ::exr::meta::attribute::AttributeValue;
        use ::exr::prelude::*;
        use tessera_protocol::job::TileRect;
        let (w, h) = (4usize, 3usize);
        let rect = TileRect {
            x: 0,
            y: 0,
            width: w as u32,
            height: h as u32,
        };
        // 8 samples at 1.0, 24 at 3.0: 2.5 over all 32.
        let parts = vec![flat_tile(w, h, 1.0, "8"), flat_tile(w, h, 3.0, "24")];
        let frame = stitch_layers(w as u32, h as u32, &[(rect, parts)], &[8, 24]).unwrap();
        let layer = read_layer(0, &frame).unwrap();
        assert_eq!(
            layer.encoding.compression,
            ::exr::compression::Compression::ZIP16
        );
        assert_eq!(
            layer
                .attributes
                .other
                .get(&Text::from("cycles.View.samples")),
            Some(&AttributeValue::Text(Text::from("32"))),
            "the stamp names all samples"
        );
        for c in &layer.channel_data.list {
            match &c.sample_data {
                FlatSamples::F16(v) => assert!(v.iter().all(|x| x.to_f32() == 2.5)),
                // Depth is sample 0's: the first range's, not a mean.
                FlatSamples::F32(v) => assert!(v.iter().all(|&x| x == 1.0), "{}", c.name),
                FlatSamples::U32(_) => unreachable!(),
            }
        }
        assert!(one_sample_pass("Second.IndexOB.X") && one_sample_pass("Z"));
        assert!(!one_sample_pass("View.Normal.Z") && !one_sample_pass("View.Combined.R"));
        // Ranges that do not hold the same channels are refused.
        let mut odd = flat_tile(w, h, 1.0, "8");
        odd = {
            let mut l = read_layer(0, &odd).unwrap();
            l.channel_data.list.pop();
            let mut out = std::io::Cursor::new(Vec::new());
            Image::from_layer(l).write().to_buffered(&mut out).unwrap();
            out.into_inner()
        };
        let parts = vec![flat_tile(w, h, 1.0, "8"), odd];
        let err = stitch_layers(w as u32, h as u32, &[(rect, parts)], &[8, 24]).unwrap_err();
        assert!(
            matches!(err, crate::stitch::StitchError::MixedFormats { index: 0 }),
            "{err}"
        );
        // A missing range is an error, not a frame of fewer samples.
        let parts = vec![flat_tile(w, h, 1.0, "8")];
        assert!(stitch_layers(w as u32, h as u32, &[(rect, parts)], &[8, 24]).is_err());
    }
}
