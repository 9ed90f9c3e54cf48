//! An `ffmpeg` step: the encode of the frames of the one step it depends
//! on, as a Deadline-style template writes it (`ffmpeg -y -framerate 24
//! -i {{Param.OutputDir}}/output_%04d.jpg -c:v libx264 -pix_fmt yuv420p
//! {{Param.OutputDir}}/shot.mp4`). Its input must be that step's
//! `--render-output` frames, its output a movie file under the output
//! directory; its options those of `tessera_protocol::encode`. Anything
//! else is refused naming it.

use tessera_protocol::encode as wire;

use super::*;

/// An ffmpeg step as Tessera runs it.
#[derive(Debug, Clone, PartialEq)]
pub struct Encode {
    /// The frames it reads, as the step it depends on names them: the
    /// input pattern with its `%0Nd` written as N `#` (`output_####.jpg`).
    pub input: RenderOutput,
    /// ffmpeg options for the input (`-framerate 24`).
    pub input_options: Vec<String>,
    /// ffmpeg options for the output (`-c:v libx264 -pix_fmt yuv420p`).
    pub output_options: Vec<String>,
    /// Where the movie goes: `name` is its file name.
    pub movie: RenderOutput,
}

/// Reads an ffmpeg command line (`field` names where it was).
pub(super) fn ffmpeg_options(
    field: &str,
    args: &[String],
    out_dirs: &[PathBuf],
) -> Result<Encode, String> {
    let (mut input, mut movie) = (None, None);
    let (mut input_options, mut output_options) = (Vec::new(), Vec::new());
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        if arg.contains(FRAME) {
            return Err(format!(
                "{field}: `{}`: an ffmpeg step runs once; it cannot use the task parameter",
                arg.replace(FRAME, "{{frame}}")
            ));
        }
        let before_input = input.is_none();
        match arg.as_str() {
            "-y" | "-hide_banner" | "-nostdin" | "-nostats" | "-stats" => {}
            "-loglevel" | "-v" => {
                next_value(&mut it, field, arg)?;
            }
            // The worker numbers the frames it lays out from 1.
            "-start_number" => {
                let v = next_value(&mut it, field, arg)?;
                frame_number(v.trim()).map_err(|e| format!("{field}: `{arg}` {e}"))?;
            }
            "-f" | "-pattern_type" if before_input => {
                let v = next_value(&mut it, field, arg)?;
                if !matches!(v.as_str(), "image2" | "sequence") {
                    return Err(format!(
                        "{field}: `{arg} {v}`: the input is an image sequence (image2)"
                    ));
                }
            }
            "-i" => {
                if !before_input {
                    return Err(format!("{field}: a second input `-i` cannot be mapped: an encode reads the frames of the step it depends on"));
                }
                let v = next_value(&mut it, field, arg)?;
                input = Some(input_pattern(field, &v, out_dirs)?);
            }
            flag if flag.starts_with('-') => {
                let v = match wire::takes_value(flag, before_input) {
                    Some(true) => Some(next_value(&mut it, field, flag)?),
                    Some(false) => None,
                    None => {
                        return Err(format!(
                            "{field}: ffmpeg's `{flag}` cannot be mapped: an encode step takes the frame rate, codec, pixel format and quality options only"
                        ))
                    }
                };
                wire::check_option(flag, v.as_deref(), before_input)
                    .map_err(|e| format!("{field}: {e}"))?;
                let list = if before_input {
                    &mut input_options
                } else {
                    &mut output_options
                };
                list.push(flag.to_string());
                list.extend(v);
            }
            path if before_input => {
                return Err(format!(
                    "{field}: `{path}` comes before ffmpeg's input `-i`"
                ))
            }
            path => {
                if movie.is_some() {
                    return Err(format!(
                        "{field}: `{path}`: an encode step writes one movie"
                    ));
                }
                // `http:`, `tee:`, `pipe:`…: ffmpeg reads a protocol, not a
                // file (the worker writes its own file; the name would only
                // make odd folders here).
                let protocol = path.split_once(':').is_some_and(|(p, _)| {
                    !p.is_empty()
                        && !p.contains('/')
                        && p.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
                });
                if protocol || path.chars().any(char::is_control) {
                    return Err(format!(
                        "{field}: `{}` is not a movie file: ffmpeg's output is a file under the output directory",
                        path.escape_debug()
                    ));
                }
                let (root, subdir, name) = output_path(field, "ffmpeg's output", path, out_dirs)?;
                wire::check_movie_name(&name).map_err(|e| format!("{field}: {e}"))?;
                movie = Some(RenderOutput {
                    root,
                    subdir,
                    name,
                    extension: false,
                });
            }
        }
    }
    let input = input.ok_or_else(|| format!("{field}: ffmpeg has no input `-i`"))?;
    let movie = movie.ok_or_else(|| format!("{field}: ffmpeg names no output movie"))?;
    Ok(Encode {
        input,
        input_options,
        output_options,
        movie,
    })
}

/// ffmpeg's input pattern (`DIR/output_%04d.jpg`) as a `--render-output`
/// path with `#` for the frame (`output_####.jpg`).
fn input_pattern(field: &str, pattern: &str, out_dirs: &[PathBuf]) -> Result<RenderOutput, String> {
    let (root, subdir, name) = output_path(field, "ffmpeg's input", pattern, out_dirs)?;
    let bad = || {
        format!(
            "{field}: ffmpeg's input `{pattern}` is not a frame sequence such as `output_%04d.jpg`"
        )
    };
    let (head, rest) = name.split_once('%').ok_or_else(bad)?;
    let (digits, tail) = rest.split_once('d').ok_or_else(bad)?;
    let width: usize = match digits.strip_prefix('0') {
        Some(w) => w.parse().map_err(|_| bad())?,
        None => return Err(format!("{field}: ffmpeg's input `{pattern}`: Blender pads frame numbers, so the pattern is `%0Nd` (`%04d` for `####`)")),
    };
    if !(1..=10).contains(&width) || tail.contains(['%', '#']) || head.contains('#') {
        return Err(bad());
    }
    Ok(RenderOutput {
        root,
        subdir,
        name: format!("{head}{}{tail}", "#".repeat(width)),
        extension: false,
    })
}

/// Checks that an encode step reads the frames of the step it depends on
/// (`frames`, with `format` when the template gives one), as that step's
/// `--render-output` names them.
pub(super) fn check_input(at: &str, encode: &Encode, step: &Step) -> Result<(), String> {
    let Some(out) = &step.output else {
        return Err(format!("{at}: ffmpeg reads the frames of step {}, which names none: give it --render-output DIR/NAME#### and --use-extension 1", step.name));
    };
    let input = &encode.input;
    let ext = match (out.extension, input.name.strip_prefix(out.name.as_str())) {
        (true, Some(rest)) => rest.strip_prefix('.'),
        (false, Some("")) => Some(""),
        _ => None,
    };
    let same_place = input.root == out.root && input.subdir == out.subdir;
    let fits_format = match (ext, step.format) {
        (Some(""), _) => true,
        (Some(e), Some(f)) => e.eq_ignore_ascii_case(format_extension(f)),
        (Some(e), None) => wire::is_image_extension(&e.to_ascii_lowercase()),
        (None, _) => false,
    };
    if !same_place || !fits_format {
        let place = |o: &RenderOutput| {
            let mut p = o
                .root
                .as_ref()
                .map_or(String::new(), |r| format!("{}/", r.display()));
            if !o.subdir.is_empty() {
                p.push_str(&o.subdir);
                p.push('/');
            }
            p
        };
        return Err(format!(
            "{at}: ffmpeg's input `{}{}` is not the frames of step {} (`{}{}{}`)",
            place(input),
            input.name,
            step.name,
            place(out),
            out.name,
            match (out.extension, step.format) {
                (true, Some(f)) => format!(".{}", format_extension(f)),
                (true, None) => ".EXT".to_string(),
                (false, _) => String::new(),
            }
        ));
    }
    Ok(())
}

/// The extension Blender gives a format.
pub(super) fn format_extension(format: ImageFormat) -> &'static str {
    match format {
        ImageFormat::Jpeg => "jpg",
        ImageFormat::Png => "png",
        ImageFormat::OpenExr => "exr",
    }
}
