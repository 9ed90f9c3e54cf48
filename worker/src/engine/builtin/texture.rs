//! Image textures and PNG helpers. A scene's textures are loaded once per job
//! from the folder holding the scene file, converted from sRGB to linear RGB,
//! and sampled bilinearly with wrap-around. The same PNG helpers encode and
//! decode the RGB8 tiles and frames the engine hands back.

use std::path::Path;

use super::math::Vec3;
use super::{Scene, SceneError};

/// One texture in linear RGB, row-major, top row first.
#[derive(Debug, Clone)]
pub(crate) struct Image {
    width: u32,
    height: u32,
    texels: Vec<Vec3>,
}

impl Image {
    fn from_srgb8(width: u32, height: u32, rgb: &[u8]) -> Image {
        let decode = |c: u8| {
            let c = c as f32 / 255.0;
            if c <= 0.04045 {
                c / 12.92
            } else {
                ((c + 0.055) / 1.055).powf(2.4)
            }
        };
        let lut: Vec<f32> = (0..=255u8).map(decode).collect();
        let texels = rgb
            .chunks_exact(3)
            .map(|p| Vec3::new(lut[p[0] as usize], lut[p[1] as usize], lut[p[2] as usize]))
            .collect();
        Image {
            width,
            height,
            texels,
        }
    }

    /// Bilinear sample at texture coordinates (`u` right, `v` up), wrapping.
    pub(crate) fn sample(&self, u: f32, v: f32) -> Vec3 {
        let (w, h) = (self.width as i64, self.height as i64);
        let x = (u - u.floor()) * w as f32 - 0.5;
        let y = (1.0 - (v - v.floor())) * h as f32 - 0.5;
        let (x0, y0) = (x.floor(), y.floor());
        let (fx, fy) = (x - x0, y - y0);
        let texel = |dx: i64, dy: i64| {
            let tx = (x0 as i64 + dx).rem_euclid(w);
            let ty = (y0 as i64 + dy).rem_euclid(h);
            self.texels[(ty * w + tx) as usize]
        };
        let top = texel(0, 0).lerp(texel(1, 0), fx);
        let bottom = texel(0, 1).lerp(texel(1, 1), fx);
        top.lerp(bottom, fy)
    }
}

/// The decoded textures of one scene, in the order of [`Scene::texture_paths`].
#[derive(Debug, Clone)]
pub struct Textures {
    images: Vec<Image>,
}

impl Textures {
    /// Loads every texture the scene names from `base_dir` (the folder holding
    /// the scene file). PNG, 8-bit RGB/RGBA/gray (16-bit and palette are converted).
    pub fn load(scene: &Scene, base_dir: &Path) -> Result<Textures, SceneError> {
        let images = scene
            .texture_paths()
            .into_iter()
            .map(|path| {
                let resolved = base_dir.join(&path);
                let fail = |message: String| SceneError::Texture {
                    path: path.clone(),
                    resolved: resolved.display().to_string(),
                    message,
                };
                let bytes = std::fs::read(&resolved).map_err(|e| fail(e.to_string()))?;
                let (width, height, rgb) =
                    decode_png_rgb(&bytes).map_err(|e| fail(e.to_string()))?;
                Ok(Image::from_srgb8(width, height, &rgb))
            })
            .collect::<Result<_, SceneError>>()?;
        Ok(Textures { images })
    }

    /// The texture at `index` of the scene's texture paths.
    pub(crate) fn get(&self, index: usize) -> Option<&Image> {
        self.images.get(index)
    }
}

/// Encodes RGB8 pixels (row-major, `width * height * 3` bytes) as a lossless PNG.
///
/// # Panics
/// If `rgb` has the wrong length or either dimension is zero.
pub fn encode_png(width: u32, height: u32, rgb: &[u8]) -> Vec<u8> {
    assert_eq!(
        rgb.len(),
        width as usize * height as usize * 3,
        "RGB8 buffer size"
    );
    let mut out = Vec::new();
    let mut encoder = png::Encoder::new(&mut out, width, height);
    encoder.set_color(png::ColorType::Rgb);
    encoder.set_depth(png::BitDepth::Eight);
    let mut writer = encoder
        .write_header()
        .expect("PNG header for a non-empty image");
    writer.write_image_data(rgb).expect("PNG data into a Vec");
    writer.finish().expect("PNG end into a Vec");
    out
}

/// Decodes a PNG into (width, height, RGB8 pixels). Gray is expanded to RGB,
/// alpha is dropped, 16-bit is reduced to 8-bit and palettes are expanded.
pub fn decode_png_rgb(bytes: &[u8]) -> Result<(u32, u32, Vec<u8>), SceneError> {
    let bad = |e: png::DecodingError| SceneError::Png(e.to_string());
    let mut decoder = png::Decoder::new(bytes);
    decoder.set_transformations(png::Transformations::EXPAND | png::Transformations::STRIP_16);
    let mut reader = decoder.read_info().map_err(bad)?;
    let mut buf = vec![0; reader.output_buffer_size()];
    let info = reader.next_frame(&mut buf).map_err(bad)?;
    buf.truncate(info.buffer_size());
    let rgb = match info.color_type {
        png::ColorType::Rgb => buf,
        png::ColorType::Rgba => buf
            .chunks_exact(4)
            .flat_map(|p| [p[0], p[1], p[2]])
            .collect(),
        png::ColorType::Grayscale => buf.iter().flat_map(|&g| [g; 3]).collect(),
        png::ColorType::GrayscaleAlpha => buf.chunks_exact(2).flat_map(|p| [p[0]; 3]).collect(),
        png::ColorType::Indexed => return Err(SceneError::Png("palette was not expanded".into())),
    };
    Ok((info.width, info.height, rgb))
}
