//! Memory-over-requests charts drawn with plotters: SVG for the page (inline) and beside the
//! report, PNG for anything else. The font is bundled (DejaVu Sans, see assets/), so no system
//! font is needed to draw; plotters escapes every label it writes into the SVG.

use crate::page::Svg;
use crate::{Attachment, Error, Result};
use plotters::coord::Shift;
use plotters::prelude::*;
use std::sync::Once;

static FONT: Once = Once::new();

fn register_font() {
    FONT.call_once(|| {
        let _ = plotters::style::register_font(
            "sans-serif",
            FontStyle::Normal,
            include_bytes!("../assets/DejaVuSans.ttf"),
        );
    });
}

const SIZE: (u32, u32) = (960, 540);

/// One chart: a line per series (x: request, y: MB above the first sample), with the end of the
/// warm-up marked.
#[derive(Debug, Clone, PartialEq)]
pub struct Chart {
    /// The file stem of `<name>.svg` and `<name>.png`.
    pub name: String,
    pub title: String,
    pub lines: Vec<(String, Vec<(f64, f64)>)>,
    pub warmup: usize,
}

impl Chart {
    pub fn new(
        name: impl Into<String>,
        title: impl Into<String>,
        lines: Vec<(String, Vec<(f64, f64)>)>,
        warmup: usize,
    ) -> Chart {
        Chart {
            name: name.into(),
            title: title.into(),
            lines,
            warmup,
        }
    }

    pub fn svg(&self) -> Result<Svg> {
        register_font();
        let mut svg = String::new();
        {
            let root = SVGBackend::with_string(&mut svg, SIZE).into_drawing_area();
            self.draw(&root)?;
            root.present().map_err(|e| self.failed(e))?;
        }
        Ok(Svg::drawn(svg))
    }

    /// The PNG, encoded in memory (plotters' own encoder would need a path, and the write
    /// would not be atomic).
    pub fn png(&self) -> Result<Vec<u8>> {
        register_font();
        let (w, h) = SIZE;
        let mut pixels = vec![0u8; (w * h * 3) as usize];
        {
            let root = BitMapBackend::with_buffer(&mut pixels, SIZE).into_drawing_area();
            self.draw(&root)?;
            root.present().map_err(|e| self.failed(e))?;
        }
        let mut png = Vec::new();
        use image::ImageEncoder;
        image::codecs::png::PngEncoder::new(&mut png)
            .write_image(&pixels, w, h, image::ColorType::Rgb8)
            .map_err(|e| self.failed(e))?;
        Ok(png)
    }

    /// `<name>.svg` and `<name>.png`, to write beside the report.
    pub fn files(&self) -> Result<Vec<Attachment>> {
        Ok(vec![
            Attachment::new(format!("{}.svg", self.name), self.svg()?.as_str()),
            Attachment::new(format!("{}.png", self.name), self.png()?),
        ])
    }

    fn failed(&self, e: impl std::fmt::Debug) -> Error {
        Error::Plot {
            chart: self.name.clone(),
            reason: format!("{e:?}"),
        }
    }

    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> Result<()>
    where
        DB::ErrorType: 'static,
    {
        let e = |e| self.failed(e);
        root.fill(&WHITE).map_err(e)?;
        let points = self.lines.iter().flat_map(|(_, l)| l.iter());
        let (mut x_max, mut y_min, mut y_max) = (1.0f64, 0.0f64, 0.0f64);
        for (x, y) in points {
            x_max = x_max.max(*x);
            y_min = y_min.min(*y);
            y_max = y_max.max(*y);
        }
        let pad = ((y_max - y_min) * 0.08).max(0.01);
        // Sizes for a chart read at about its own width, on a page or as a PNG: plotters'
        // defaults are too small to read there.
        let mut chart = ChartBuilder::on(root)
            .caption(&self.title, ("sans-serif", 24))
            .margin(14)
            .x_label_area_size(52)
            .y_label_area_size(84)
            .build_cartesian_2d(0.0..x_max, (y_min - pad)..(y_max + pad))
            .map_err(e)?;
        chart
            .configure_mesh()
            .x_desc("request")
            .y_desc("MB above the first sample")
            .label_style(("sans-serif", 17))
            .axis_desc_style(("sans-serif", 18))
            .x_label_formatter(&|x| format!("{x:.0}"))
            .light_line_style(BLACK.mix(0.04))
            .bold_line_style(BLACK.mix(0.12))
            .draw()
            .map_err(e)?;
        let warm = self.warmup as f64;
        let grey = ShapeStyle::from(&BLACK.mix(0.45)).stroke_width(2);
        chart
            .draw_series(LineSeries::new(
                [(warm, y_min - pad), (warm, y_max + pad)],
                grey,
            ))
            .map_err(e)?
            .label("end of warm-up")
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], grey));
        for (i, (label, line)) in self.lines.iter().enumerate() {
            let color = Palette99::pick(i).to_rgba();
            chart
                .draw_series(LineSeries::new(
                    line.iter().copied(),
                    ShapeStyle::from(&color).stroke_width(2),
                ))
                .map_err(e)?
                .label(label.as_str())
                .legend(move |(x, y)| {
                    PathElement::new(
                        [(x, y), (x + 20, y)],
                        ShapeStyle::from(&color).stroke_width(3),
                    )
                });
        }
        chart
            .configure_series_labels()
            .label_font(("sans-serif", 17))
            .background_style(WHITE.mix(0.9))
            .border_style(BLACK.mix(0.4))
            .position(SeriesLabelPosition::UpperLeft)
            .draw()
            .map_err(e)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chart(label: &str) -> Chart {
        Chart::new(
            "c",
            format!("{label}: leak"),
            vec![(
                label.to_string(),
                (0..100).map(|i| (i as f64, i as f64 * 0.016)).collect(),
            )],
            10,
        )
    }

    #[test]
    fn a_chart_draws_as_a_scalable_svg_and_a_png() {
        let svg = chart("anonymous").svg().unwrap();
        assert!(
            svg.as_str().starts_with("<svg") && svg.as_str().contains("viewBox"),
            "{}",
            &svg.as_str()[..200]
        );
        assert!(
            svg.as_str().contains("anonymous: leak") && svg.as_str().contains("end of warm-up")
        );
        let png = chart("anonymous").png().unwrap();
        assert_eq!(&png[1..4], b"PNG");
        let files = chart("anonymous").files().unwrap();
        assert_eq!(
            files.iter().map(|f| f.name.as_str()).collect::<Vec<_>>(),
            ["c.svg", "c.png"]
        );
    }

    #[test]
    fn a_label_from_outside_is_escaped_in_the_svg() {
        let svg = chart("x{pod=\"<script>a</script>\"}").svg().unwrap();
        assert!(
            !svg.as_str().contains("<script"),
            "plotters escapes the text it draws"
        );
        assert!(svg.as_str().contains("&lt;script&gt;"));
    }
}
