//! Line charts as SVG files, written with `plotters`, shared by the examples.

use anyhow::{anyhow, Result};
use plotters::prelude::*;

/// One line of a chart: its name, its points, and whether it is drawn dashed (a prediction).
pub struct Series {
    pub name: String,
    pub points: Vec<(f64, f64)>,
    pub dashed: bool,
}

/// Writes a line chart of `series` to `path` (SVG), the x axis on a log2 scale when `log_x`.
pub fn line_chart(path: &str, title: &str, x_label: &str, y_label: &str, series: &[Series], log_x: bool) -> Result<()> {
    let all = series.iter().flat_map(|s| s.points.iter());
    let (x_min, x_max) = all.clone().fold((f64::MAX, f64::MIN), |(a, b), p| (a.min(p.0), b.max(p.0)));
    let y_max = all.fold(0.0f64, |m, p| m.max(p.1)) * 1.1;
    if x_min > x_max {
        return Err(anyhow!("nothing to plot"));
    }
    let root = SVGBackend::new(path, (720, 440)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| anyhow!("{e}"))?;
    let fx = |x: f64| if log_x { x.log2() } else { x };
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(56)
        .build_cartesian_2d(fx(x_min)..fx(x_max), 0.0..y_max.max(1e-9))
        .map_err(|e| anyhow!("{e}"))?;
    chart
        .configure_mesh()
        .light_line_style(WHITE)
        // On a log scale, one label per doubling.
        .x_labels(if log_x { (fx(x_max) - fx(x_min)).round() as usize + 1 } else { 10 })
        .x_desc(x_label)
        .y_desc(y_label)
        .x_label_formatter(&|x| if log_x { format!("{:.0}", 2f64.powf(*x)) } else { format!("{x:.0}") })
        .draw()
        .map_err(|e| anyhow!("{e}"))?;
    for (i, s) in series.iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        let points: Vec<(f64, f64)> = s.points.iter().map(|&(x, y)| (fx(x), y)).collect();
        let style = color.stroke_width(2);
        let line = if s.dashed {
            chart.draw_series(DashedLineSeries::new(points.clone(), 6, 4, style))
        } else {
            chart.draw_series(LineSeries::new(points.clone(), style))
        };
        line.map_err(|e| anyhow!("{e}"))?
            .label(s.name.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2)));
        chart.draw_series(points.iter().map(|&p| Circle::new(p, 3, color.filled()))).map_err(|e| anyhow!("{e}"))?;
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperLeft)
        .draw()
        .map_err(|e| anyhow!("{e}"))?;
    root.present().map_err(|e| anyhow!("{e}"))?;
    Ok(())
}
