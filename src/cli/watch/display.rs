//! Where a watch prints: on a terminal, stage lines above an `indicatif` progress bar redrawn in
//! place; elsewhere (a pipe, a log) plain lines, the progress one every few seconds. Colour only
//! on a terminal, and never when NO_COLOR is set.

use std::io::{IsTerminal, Write};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressState, ProgressStyle, TermLike};

use crate::cli::Output;
use crate::cli::watch::decide::{MirrorProgress, Update};
use crate::cli::watch::describe::{self, STAGE_WIDTH};
use crate::pipeline::Stage;

/// Where the text goes, shared by the lines and the bar so they interleave in order.
type Sink = Arc<Mutex<Box<dyn Write + Send>>>;

/// Where a terminal's width comes from.
#[derive(Clone, Copy, Debug)]
enum Width {
    Stdout,
    Stderr,
    #[cfg(test)]
    Fixed(u16),
}

impl Width {
    fn columns(self) -> u16 {
        let term = match self {
            Width::Stdout => console::Term::stdout(),
            Width::Stderr => console::Term::stderr(),
            #[cfg(test)]
            Width::Fixed(n) => return n,
        };
        // Too narrow a width would make indicatif wrap the bar onto lines it cannot clear.
        term.size_checked().map_or(80, |(_, cols)| cols).max(20)
    }
}

/// The terminal as indicatif sees it: our sink, with the escape sequences of an ANSI terminal.
struct Terminal {
    sink: Sink,
    width: Width,
}

impl std::fmt::Debug for Terminal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Terminal")
            .field("width", &self.width)
            .finish()
    }
}

impl Terminal {
    fn write(&self, s: &str) -> std::io::Result<()> {
        self.sink
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .write_all(s.as_bytes())
    }

    fn escape(&self, n: usize, code: char) -> std::io::Result<()> {
        if n == 0 {
            return Ok(());
        }
        self.write(&format!("\x1b[{n}{code}"))
    }
}

impl TermLike for Terminal {
    fn width(&self) -> u16 {
        self.width.columns()
    }
    fn move_cursor_up(&self, n: usize) -> std::io::Result<()> {
        self.escape(n, 'A')
    }
    fn move_cursor_down(&self, n: usize) -> std::io::Result<()> {
        self.escape(n, 'B')
    }
    fn move_cursor_right(&self, n: usize) -> std::io::Result<()> {
        self.escape(n, 'C')
    }
    fn move_cursor_left(&self, n: usize) -> std::io::Result<()> {
        self.escape(n, 'D')
    }
    fn write_line(&self, s: &str) -> std::io::Result<()> {
        self.write(s)?;
        self.write("\n")
    }
    fn write_str(&self, s: &str) -> std::io::Result<()> {
        self.write(s)
    }
    fn clear_line(&self) -> std::io::Result<()> {
        self.write("\r\x1b[2K")
    }
    fn flush(&self) -> std::io::Result<()> {
        self.sink
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .flush()
    }
}

/// The bar's columns between the brackets.
const BAR_WIDTH: usize = 24;

/// Prints updates: in place on a terminal, as plain lines every few seconds otherwise.
pub struct Display {
    sink: Sink,
    /// Some on a terminal: where the bar learns the width.
    terminal: Option<Width>,
    color: bool,
    bar: Option<Bar>,
    last_plain: Option<(Instant, u64)>,
    plain_every: Duration,
}

impl Display {
    /// A display on stdout, or on stderr when stdout carries JSON.
    pub fn for_output(output: Output) -> Display {
        match output {
            Output::Text => {
                let tty = std::io::stdout().is_terminal();
                Display::build(Box::new(std::io::stdout()), tty.then_some(Width::Stdout))
            }
            Output::Json => {
                let tty = std::io::stderr().is_terminal();
                Display::build(Box::new(std::io::stderr()), tty.then_some(Width::Stderr))
            }
        }
    }

    /// A display on `out`, a terminal as wide as stdout when `tty`; colour only on a terminal
    /// and when NO_COLOR is not set.
    pub fn new(out: Box<dyn Write + Send>, tty: bool) -> Display {
        Display::build(out, tty.then_some(Width::Stdout))
    }

    fn build(out: Box<dyn Write + Send>, terminal: Option<Width>) -> Display {
        let no_color = std::env::var_os("NO_COLOR").is_some_and(|v| !v.is_empty());
        Display::with(out, terminal, !no_color)
    }

    fn with(out: Box<dyn Write + Send>, terminal: Option<Width>, color_allowed: bool) -> Display {
        Display {
            sink: Arc::new(Mutex::new(out)),
            color: terminal.is_some() && color_allowed,
            terminal,
            bar: None,
            last_plain: None,
            plain_every: Duration::from_secs(5),
        }
    }

    /// Prints one update.
    pub fn show(&mut self, update: &Update, now: Instant) {
        match update {
            Update::Stage(l) => {
                let line = describe::stage_text(l, self.color);
                self.line(&line);
            }
            Update::Mirror(p) => self.progress(p, now),
            Update::Finished(_) => self.clear_bar(),
        }
    }

    /// A whole line, above the progress bar if one is shown.
    pub fn line(&mut self, text: &str) {
        let sink = &self.sink;
        // A closed stdout (`| head`) must not stop the watch or panic.
        let write = || {
            let mut out = sink.lock().unwrap_or_else(PoisonError::into_inner);
            let _ = writeln!(out, "{text}");
            let _ = out.flush();
        };
        match &self.bar {
            Some(bar) => bar.bar.suspend(write),
            None => write(),
        }
    }

    /// Takes the progress bar off the screen, if one is shown.
    pub fn clear_bar(&mut self) {
        if let Some(bar) = self.bar.take() {
            bar.bar.finish_and_clear();
        }
    }

    fn progress(&mut self, p: &MirrorProgress, now: Instant) {
        if let Some(width) = self.terminal {
            let bar = match &mut self.bar {
                Some(bar) => bar,
                None => {
                    // Each frame starts on a cleared line, the first one too.
                    let terminal = Terminal {
                        sink: self.sink.clone(),
                        width,
                    };
                    let _ = terminal.clear_line();
                    self.bar.insert(Bar::new(terminal, self.color))
                }
            };
            bar.show(p);
            return;
        }
        let due = match self.last_plain {
            None => true,
            Some((at, done)) => {
                now.saturating_duration_since(at) >= self.plain_every && done != p.done
            }
        };
        if due {
            self.last_plain = Some((now, p.done));
            let line = describe::progress_plain(p);
            self.line(&line);
        }
    }
}

impl Drop for Display {
    fn drop(&mut self) {
        self.clear_bar();
    }
}

/// The progress bar on a terminal, and the text after it.
struct Bar {
    bar: ProgressBar,
    /// What follows the bar (percent, sizes, speed), which indicatif reads at each draw.
    tail: Arc<Mutex<String>>,
}

impl Bar {
    /// `Mirror    [=========>              ]  41%  1.2 MiB / 3.0 MiB  512.0 KiB/s  ETA 4s`, the
    /// bar green when `color`.
    fn new(terminal: Terminal, color: bool) -> Bar {
        let tail = Arc::new(Mutex::new(String::new()));
        let (on, off) = if color {
            ("\x1b[32m", "\x1b[0m")
        } else {
            ("", "")
        };
        let template = format!("{{prefix}}[{on}{{bar:{BAR_WIDTH}}}{off}] {{tail}}");
        let shown = tail.clone();
        let style = ProgressStyle::with_template(&template)
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> ")
            .with_key(
                "tail",
                move |_: &ProgressState, w: &mut dyn std::fmt::Write| {
                    let _ = w.write_str(&shown.lock().unwrap_or_else(PoisonError::into_inner));
                },
            );
        // No rate limit: the controller writes status every few seconds, and each write is one
        // frame, so a frame is never dropped (a dropped last frame would stay stale).
        let target = ProgressDrawTarget::term_like(Box::new(terminal));
        // Built with the builder methods, which draw nothing: the first frame is the first update.
        let bar = ProgressBar::with_draw_target(Some(100), target)
            .with_style(style)
            .with_prefix(format!("{:<STAGE_WIDTH$}", Stage::Mirror.name()));
        Bar { bar, tail }
    }

    /// Redraws the bar for `p`: one frame, the bar and its tail from the same observation.
    fn show(&mut self, p: &MirrorProgress) {
        *self.tail.lock().unwrap_or_else(PoisonError::into_inner) = describe::bar_tail(p);
        self.bar.update(|s| s.set_pos(u64::from(p.percent)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::watch::decide::{StageLine, Verdict};

    /// A writer whose bytes the test reads back.
    #[derive(Clone, Default)]
    struct Shared(Arc<Mutex<Vec<u8>>>);

    impl Write for Shared {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl Shared {
        fn text(&self) -> String {
            String::from_utf8(self.0.lock().unwrap().clone()).unwrap()
        }
    }

    fn mirror(done: u64, percent: u8, rate: Option<f64>) -> Update {
        Update::Mirror(MirrorProgress {
            done,
            total: 100,
            percent,
            bytes_per_second: rate,
        })
    }

    fn stage(status: &str) -> Update {
        Update::Stage(StageLine {
            stage: "Catalog".into(),
            status: status.into(),
            reason: "Cataloged".into(),
            message: "in the catalog".into(),
        })
    }

    #[test]
    fn a_plain_display_prints_progress_every_few_seconds_and_no_escape_codes() {
        let buf = Shared::default();
        let mut d = Display::with(Box::new(buf.clone()), None, true);
        let t0 = Instant::now();
        d.show(&mirror(10, 10, None), t0);
        d.show(&mirror(20, 20, None), t0 + Duration::from_secs(1));
        d.show(&mirror(30, 30, None), t0 + Duration::from_secs(6));
        d.show(&stage("True"), t0 + Duration::from_secs(7));
        assert_eq!(
            buf.text(),
            "Mirror    10%  10 B of 100 B\nMirror    30%  30 B of 100 B\nCatalog   True     Cataloged        in the catalog\n"
        );
    }

    /// The frames the terminal got: what follows each return-and-clear-line.
    fn frames(text: &str) -> Vec<&str> {
        text.split("\r\x1b[2K").filter(|f| !f.is_empty()).collect()
    }

    #[test]
    fn on_a_terminal_the_bar_is_redrawn_in_place_and_lines_go_above_it() {
        let buf = Shared::default();
        let mut d = Display::with(Box::new(buf.clone()), Some(Width::Fixed(80)), false);
        let t0 = Instant::now();
        d.show(&mirror(20, 20, None), t0);
        d.show(&mirror(50, 50, Some(10.0)), t0 + Duration::from_secs(3));
        d.show(&stage("True"), t0 + Duration::from_secs(4));
        d.show(
            &Update::Finished(Verdict::Ready),
            t0 + Duration::from_secs(5),
        );
        let text = buf.text();
        assert!(!text.contains("\x1b[3"), "no colour: {text:?}");
        let bars: Vec<&str> = frames(&text)
            .into_iter()
            .filter(|f| f.starts_with("Mirror    ["))
            .map(str::trim_end)
            .collect();
        assert_eq!(
            bars.first(),
            Some(&"Mirror    [====>                   ]  20%  20 B / 100 B")
        );
        assert!(
            bars.contains(
                &"Mirror    [============>           ]  50%  50 B / 100 B  10 B/s  ETA 5s"
            ),
            "{bars:?}"
        );
        // The bar is padded to the width, so it fills exactly one line and is cleared whole.
        let padded = frames(&text)
            .into_iter()
            .find(|f| f.starts_with("Mirror    ["))
            .unwrap();
        assert_eq!(padded.chars().count(), 80, "{padded:?}");
        assert!(
            text.contains("\r\x1b[2KCatalog   True     Cataloged        in the catalog\n"),
            "the line is printed on a cleared line, then the bar again: {text:?}"
        );
        assert!(
            text.ends_with("\r\x1b[2K"),
            "the verdict clears the bar: {text:?}"
        );
        assert!(!text.contains("Mirror    20%"), "no plain lines: {text:?}");
    }

    #[test]
    fn colour_on_a_terminal_only_unless_no_color() {
        let buf = Shared::default();
        let mut d = Display::with(Box::new(buf.clone()), Some(Width::Fixed(80)), true);
        d.show(&stage("True"), Instant::now());
        d.show(&mirror(100, 100, None), Instant::now());
        d.clear_bar();
        let text = buf.text();
        assert!(text.contains("\x1b[32mTrue    \x1b[0m"), "{text:?}");
        assert!(
            text.contains("Mirror    [\x1b[32m========================\x1b[0m] 100%"),
            "{text:?}"
        );
        // The colour codes take no room: the padded bar is still one line of 80 columns.
        let bar = frames(&text)
            .into_iter()
            .find(|f| f.starts_with("Mirror"))
            .unwrap();
        assert_eq!(console::measure_text_width(bar), 80, "{bar:?}");

        let buf = Shared::default();
        let mut d = Display::with(Box::new(buf.clone()), Some(Width::Fixed(80)), false);
        d.show(&stage("True"), Instant::now());
        d.show(&mirror(100, 100, None), Instant::now());
        drop(d);
        let text = buf.text();
        assert!(!text.contains("\x1b[32m"), "NO_COLOR: {text:?}");
        assert!(
            text.ends_with("\r\x1b[2K"),
            "dropping clears the bar: {text:?}"
        );

        let buf = Shared::default();
        let mut d = Display::with(Box::new(buf.clone()), None, true);
        d.show(&stage("True"), Instant::now());
        assert!(!buf.text().contains('\x1b'), "not a terminal: no colour");
    }
}
