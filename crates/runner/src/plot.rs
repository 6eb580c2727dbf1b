//! Memory-over-requests charts, as SVG (for the report) and PNG (for anything else), drawn with
//! plotters. The font is bundled (DejaVu Sans, see assets/), so no system font is needed.

use anyhow::{anyhow, Result};
use plotters::coord::Shift;
use plotters::prelude::*;
use std::path::Path;
use std::sync::Once;

static FONT: Once = Once::new();

fn register_font() {
    FONT.call_once(|| {
        let _ = plotters::style::register_font("sans-serif", FontStyle::Normal, include_bytes!("../assets/DejaVuSans.ttf"));
    });
}

/// Writes `<name>.svg` and `<name>.png` into `dir` (atomically): one line per series, with the
/// end of the warm-up marked.
pub fn write_chart(dir: &Path, name: &str, title: &str, lines: &[(String, Vec<(f64, f64)>)], warmup: usize) -> Result<()> {
    register_font();
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (960, 540)).into_drawing_area();
        draw(&root, title, lines, warmup)?;
    }
    crate::files::write_atomic(&dir.join(format!("{name}.svg")), svg.as_bytes())?;

    let (w, h) = (960u32, 540u32);
    let mut pixels = vec![0u8; (w * h * 3) as usize];
    {
        let root = BitMapBackend::with_buffer(&mut pixels, (w, h)).into_drawing_area();
        draw(&root, title, lines, warmup)?;
        root.present().map_err(|e| anyhow!("{e}"))?;
    }
    let mut png = Vec::new();
    {
        let encoder = image_png_encoder(&mut png, w, h);
        encoder(&pixels)?;
    }
    crate::files::write_atomic(&dir.join(format!("{name}.png")), &png)?;
    Ok(())
}

/// PNG encoding through plotters' own encoder would need a file path; encoding in memory keeps
/// the write atomic.
fn image_png_encoder(out: &mut Vec<u8>, w: u32, h: u32) -> impl FnOnce(&[u8]) -> Result<()> + '_ {
    move |pixels| {
        use image::ImageEncoder;
        image::codecs::png::PngEncoder::new(out).write_image(pixels, w, h, image::ColorType::Rgb8).map_err(|e| anyhow!("{e}"))
    }
}

fn draw<DB: DrawingBackend>(root: &DrawingArea<DB, Shift>, title: &str, lines: &[(String, Vec<(f64, f64)>)], warmup: usize) -> Result<()>
where
    DB::ErrorType: 'static,
{
    root.fill(&WHITE).map_err(|e| anyhow!("{e:?}"))?;
    let points = lines.iter().flat_map(|(_, l)| l.iter());
    let (mut x_max, mut y_min, mut y_max) = (1.0f64, 0.0f64, 0.0f64);
    for (x, y) in points {
        x_max = x_max.max(*x);
        y_min = y_min.min(*y);
        y_max = y_max.max(*y);
    }
    let pad = ((y_max - y_min) * 0.08).max(0.01);
    let mut chart = ChartBuilder::on(root)
        .caption(title, ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(0.0..x_max, (y_min - pad)..(y_max + pad))
        .map_err(|e| anyhow!("{e:?}"))?;
    chart.configure_mesh().x_desc("request").y_desc("MB above the first sample").draw().map_err(|e| anyhow!("{e:?}"))?;
    let warm = warmup as f64;
    chart
        .draw_series(LineSeries::new([(warm, y_min - pad), (warm, y_max + pad)], ShapeStyle::from(&BLACK.mix(0.3)).stroke_width(1)))
        .map_err(|e| anyhow!("{e:?}"))?
        .label("end of warm-up")
        .legend(|(x, y)| PathElement::new([(x, y), (x + 16, y)], BLACK.mix(0.3)));
    for (i, (label, line)) in lines.iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        chart
            .draw_series(LineSeries::new(line.iter().copied(), ShapeStyle::from(&color).stroke_width(2)))
            .map_err(|e| anyhow!("{e:?}"))?
            .label(label.as_str())
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 16, y)], ShapeStyle::from(&color).stroke_width(2)));
    }
    chart.configure_series_labels().background_style(WHITE.mix(0.85)).border_style(BLACK).position(SeriesLabelPosition::UpperLeft).draw().map_err(|e| anyhow!("{e:?}"))?;
    Ok(())
}
