//! Text from the API server made fit to print: whatever a condition, a reason or a field holds
//! (any length, any unicode, escape sequences), it becomes one line of at most so many chars.

/// The most chars a condition message takes on one line.
pub const MESSAGE_CHARS: usize = 400;
/// The most chars a reason, a status or another short field takes.
pub const WORD_CHARS: usize = 64;
/// The most chars a name, path or address takes.
pub const NAME_CHARS: usize = 253;

/// Marks text that was cut.
const ELLIPSIS: char = '…';

/// `s` on one line with at most `max_chars` chars: control and bidirectional-override chars
/// become spaces, runs of whitespace one space, and a longer text ends in `…`. Cuts between
/// chars, never inside one, and never leaves a joiner or variation selector dangling at the cut.
pub fn shown(s: &str, max_chars: usize) -> String {
    let mut out = String::with_capacity(s.len().min(max_chars.saturating_mul(4)));
    let mut cut = false;
    for (count, c) in normalized(s).enumerate() {
        if count == max_chars {
            cut = true;
            break;
        }
        out.push(c);
    }
    if cut && max_chars > 0 {
        // Room for the ellipsis, and no half of a joined emoji or a space before it.
        out.pop();
        while out.ends_with(dangling) || out.ends_with(' ') {
            out.pop();
        }
        out.push(ELLIPSIS);
    }
    out
}

/// The chars of `s` with every run of whitespace, control and direction chars as one space,
/// none at either end.
fn normalized(s: &str) -> impl Iterator<Item = char> + '_ {
    let mut chars = s.chars();
    let mut started = false;
    let mut held: Option<char> = None;
    std::iter::from_fn(move || {
        if let Some(c) = held.take() {
            return Some(c);
        }
        let mut gap = false;
        for c in chars.by_ref() {
            if c.is_whitespace() || c.is_control() || is_direction_override(c) {
                gap = true;
                continue;
            }
            if gap && started {
                held = Some(c);
                return Some(' ');
            }
            started = true;
            return Some(c);
        }
        None
    })
}

/// Chars that only mean something together with the char after them (or that modify the one
/// before in a way a cut makes meaningless): a zero-width joiner, variation selectors.
fn dangling(c: char) -> bool {
    matches!(c, '\u{200D}' | '\u{FE00}'..='\u{FE0F}')
}

/// Bidirectional overrides and isolates, which can make a line read backwards on a terminal.
fn is_direction_override(c: char) -> bool {
    matches!(c, '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}' | '\u{200E}' | '\u{200F}')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_text_is_kept_as_it_is() {
        assert_eq!(
            shown("Q4_K_M, 2.0 MiB in 1 file", 400),
            "Q4_K_M, 2.0 MiB in 1 file"
        );
        assert_eq!(shown("", 10), "");
        assert_eq!(shown("exactly10!", 10), "exactly10!");
    }

    #[test]
    fn a_10000_char_cyrillic_message_is_cut_by_chars_not_bytes() {
        let message = "ж".repeat(10_000);
        let s = shown(&message, MESSAGE_CHARS);
        assert_eq!(s.chars().count(), MESSAGE_CHARS);
        assert!(s.ends_with('…'), "{s}");
        assert_eq!(s.chars().filter(|&c| c == 'ж').count(), MESSAGE_CHARS - 1);
    }

    #[test]
    fn an_emoji_at_the_cut_is_kept_whole_or_left_out() {
        // Nine letters then a four-byte emoji: with 10 chars of room the emoji would be the
        // tenth and the text goes on, so the cut comes before it.
        let s = shown("abcdefghi😀 and more", 10);
        assert_eq!(s, "abcdefghi…");
        let s = shown("abcdefgh😀", 10);
        assert_eq!(s, "abcdefgh😀", "fits: nothing cut");
        let s = shown("abcdefgh😀xyz", 10);
        assert_eq!(s, "abcdefgh😀…");
        // A joined emoji (family: man, ZWJ, woman) cut after the joiner loses the joiner too.
        let s = shown("abcdefg👨\u{200D}👩 and more", 10);
        assert_eq!(s, "abcdefg👨…");
        for max in 0..30 {
            let s = shown("ab😀cd👨\u{200D}👩\u{FE0F}ef ж gh", max);
            assert!(s.chars().count() <= max, "{max}: {s}");
        }
    }

    #[test]
    fn escape_sequences_and_line_breaks_cannot_reach_the_terminal() {
        assert_eq!(
            shown("line one\r\n\x1b[2Jline\ttwo\u{202E}evil", 100),
            "line one [2Jline two evil"
        );
        assert_eq!(shown("   spaced   out  ", 100), "spaced out");
    }

    #[test]
    fn no_room_gives_an_empty_or_bare_ellipsis() {
        assert_eq!(shown("abc", 0), "");
        assert_eq!(shown("abc", 1), "…");
        assert_eq!(shown("abc", 2), "a…");
        assert_eq!(shown("abc", 3), "abc");
    }
}
