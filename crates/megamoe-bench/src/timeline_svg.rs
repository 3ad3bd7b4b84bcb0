//! A fused forward's timeline as a picture: every GEMM tile a bar on its SM's row over time (L1, L2),
//! the grid's stages (count, plan, dispatch, combine) bands across all rows — the overlap as the
//! seed's figure 5 draws it.

use std::path::Path;

use megamoe_kernel::timeline::{EventKind, Timeline};
use plotters::prelude::*;

/// The colour of each kind of event.
fn colour(kind: EventKind) -> RGBColor {
    match kind {
        EventKind::Count | EventKind::Plan => RGBColor(150, 150, 150),
        EventKind::Dispatch => RGBColor(230, 159, 0),
        EventKind::L1Tile | EventKind::Tile => RGBColor(0, 114, 178),
        EventKind::L2Tile => RGBColor(0, 158, 115),
        EventKind::CombineSend | EventKind::CombineReduce => RGBColor(204, 121, 167),
    }
}

/// Writes `timeline` as an SVG picture to `path`, titled `title`.
pub fn write_svg(timeline: &Timeline, title: &str, path: &Path) -> Result<(), String> {
    let draw = || -> Result<(), Box<dyn std::error::Error>> {
        let span_us = (timeline.span_ns() as f64 * 1e-3).max(1.0);
        let sms = timeline
            .events
            .iter()
            .filter_map(|e| e.sm)
            .max()
            .map_or(1, |sm| sm + 1);
        let root = SVGBackend::new(path, (1600, 200 + 6 * sms)).into_drawing_area();
        root.fill(&WHITE)?;
        let mut chart = ChartBuilder::on(&root)
            .caption(title, ("sans-serif", 20))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(50)
            .build_cartesian_2d(0.0..span_us, 0.0..f64::from(sms))?;
        chart
            .configure_mesh()
            .disable_mesh()
            .x_desc("µs from the first event")
            .y_desc("SM")
            .draw()?;
        for kind in EventKind::ALL {
            let bars: Vec<_> = timeline
                .events
                .iter()
                .filter(|e| e.kind == kind)
                .map(|e| {
                    let (x0, x1) = (e.start_ns as f64 * 1e-3, e.end_ns as f64 * 1e-3);
                    match e.sm {
                        Some(sm) => {
                            let y = f64::from(sm);
                            Rectangle::new([(x0, y + 0.1), (x1, y + 0.9)], colour(kind).filled())
                        }
                        // The grid's stage: a band across every SM.
                        None => Rectangle::new(
                            [(x0, 0.0), (x1, f64::from(sms))],
                            colour(kind).mix(0.35).filled(),
                        ),
                    }
                })
                .collect();
            if bars.is_empty() {
                continue;
            }
            chart
                .draw_series(bars)?
                .label(kind.name())
                .legend(move |(x, y)| {
                    Rectangle::new([(x, y - 5), (x + 12, y + 5)], colour(kind).filled())
                });
        }
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .draw()?;
        root.present()?;
        Ok(())
    };
    draw().map_err(|e| format!("{}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use megamoe_kernel::timeline::{Event, TileEvent};

    #[test]
    fn draws_tiles_on_their_sms_and_stages_across_the_grid() {
        let tile = |kind, sm, start_ns, end_ns| Event {
            kind,
            cta: Some(sm),
            sm: Some(sm),
            start_ns,
            end_ns,
            tile: Some(TileEvent {
                expert: 0,
                row0: 0,
                rows: 128,
                n_col: 0,
                k_blocks: 56,
                sm_cycles: 7_000,
            }),
        };
        let timeline = Timeline {
            events: vec![
                Event {
                    kind: EventKind::Dispatch,
                    cta: None,
                    sm: None,
                    start_ns: 0,
                    end_ns: 1_000,
                    tile: None,
                },
                tile(EventKind::L1Tile, 0, 1_000, 5_000),
                tile(EventKind::L2Tile, 3, 5_000, 9_000),
            ],
            dropped: 0,
        };
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.svg");
        write_svg(&timeline, "test", &path).unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        assert!(svg.starts_with("<svg"), "{}", &svg[..svg.len().min(80)]);
        for label in ["dispatch", "L1", "L2", "test"] {
            assert!(svg.contains(label), "no {label} in the picture");
        }
        assert!(
            !svg.contains("combine"),
            "no combine events, no legend entry"
        );
    }
}
