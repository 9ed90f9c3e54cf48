//! What a render is accepted on: Blender's own report of what it rendered
//! (frame, size, passes, stamped samples) checked against the task, and a
//! tile cut out of a whole-frame output with its pixels unchanged.

use super::*;

/// Accepts a render only on Blender's own evidence that it rendered what
/// was asked: the frame, the size, the passes the scene asks for, and
/// (Cycles) the samples it stamped into the file. An error here is what a canceled or empty render looks like.
pub(super) fn check_evidence(
    r: &Rendered,
    task: &TaskSpec,
    frame: (u32, u32),
) -> anyhow::Result<()> {
    let e = &r.evidence;
    let tile = (task.tile.width, task.tile.height);
    anyhow::ensure!(
        (r.width, r.height) == tile,
        "blender rendered a {}x{} tile, the task is {}x{}",
        r.width,
        r.height,
        tile.0,
        tile.1
    );
    let written = if r.crop.is_some() { frame } else { tile };
    anyhow::ensure!(
        (e.width, e.height) == written,
        "blender's output is {}x{} pixels, expected {}x{}",
        e.width,
        e.height,
        written.0,
        written.1
    );
    anyhow::ensure!(e.channels >= 1, "blender's output has no colour channels");
    anyhow::ensure!(
        e.frame == Some(i64::from(task.frame)),
        "blender's output is stamped frame {}, the task is frame {}",
        e.frame.map_or("(none)".into(), |f| f.to_string()),
        task.frame
    );
    if let Some(asked) = &r.asked_passes {
        // Blender may add passes of its own; every pass asked for must be there.
        let held = e.passes.as_deref().unwrap_or_default();
        let missing: Vec<&str> = (asked.iter())
            .filter(|p| !held.contains(p))
            .map(String::as_str)
            .collect();
        anyhow::ensure!(
            missing.is_empty(),
            "blender's output lacks the passes {} that the scene asks for (it holds {})",
            missing.join(", "),
            if held.is_empty() {
                "none".to_string()
            } else {
                held.join(", ")
            }
        );
    }
    anyhow::ensure!(
        r.finished == task.finish.is_some(),
        "blender's reply is {}, the task is {}",
        if r.finished {
            "a finished frame"
        } else {
            "a render"
        },
        if task.finish.is_some() {
            "a finishing task"
        } else {
            "a render"
        }
    );
    if r.engine == "CYCLES" && !r.finished {
        let want = task.samples.1 - task.samples.0;
        if !e.stamped {
            anyhow::ensure!(
                r.samples == want,
                "blender was set to {} samples, the task asks for {want}",
                r.samples
            );
            return Ok(());
        }
        anyhow::ensure!(
            r.samples == want,
            "blender was set to {} samples, the task asks for {want}",
            r.samples
        );
        // A subset render stamps the count of the render it is part of.
        let stamped = if r.subset { task.total_samples } else { want };
        anyhow::ensure!(
            e.samples.values().any(|&n| n == stamped) && e.samples.values().all(|&n| n <= stamped),
            "Cycles reports {:?} samples per view layer, the task asks for {want}",
            e.samples
        );
    }
    Ok(())
}

/// Cuts the `w` x `h` rectangle at (x, y) out of a PNG, keeping its colour
/// type and bit depth, so the tile's pixels are exactly the frame's.
pub(super) fn crop_png(bytes: &[u8], x: u32, y: u32, w: u32, h: u32) -> anyhow::Result<Vec<u8>> {
    let mut decoder = png::Decoder::new(std::io::Cursor::new(bytes));
    decoder.set_transformations(png::Transformations::IDENTITY);
    let mut reader = decoder
        .read_info()
        .context("blender's output is not a PNG")?;
    let mut data = vec![0; reader.output_buffer_size()];
    let info = reader.next_frame(&mut data)?;
    anyhow::ensure!(
        x + w <= info.width && y + h <= info.height,
        "tile {w}x{h} at {x},{y} lies outside blender's {}x{} output",
        info.width,
        info.height
    );
    let bits = info.color_type.samples() * info.bit_depth as usize;
    anyhow::ensure!(
        bits.is_multiple_of(8),
        "sub-byte PNG pixels are not supported"
    );
    let bpp = bits / 8;
    let mut tile = Vec::with_capacity(w as usize * h as usize * bpp);
    for row in y..y + h {
        let start = row as usize * info.line_size + x as usize * bpp;
        tile.extend_from_slice(&data[start..start + w as usize * bpp]);
    }
    let mut out = Vec::new();
    {
        let mut encoder = png::Encoder::new(&mut out, w, h);
        encoder.set_color(info.color_type);
        encoder.set_depth(info.bit_depth);
        let mut writer = encoder.write_header()?;
        writer.write_image_data(&tile)?;
    }
    Ok(out)
}
