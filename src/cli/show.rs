//! Other agents' text, made safe for a terminal: it may carry escape
//! sequences (clear the screen, retitle the window, fake a prompt) or bidi
//! controls that reorder what the reader sees. Those become `\u{FFFD}`.

use crate::domain::types::is_hidden_char;

/// `text` with control characters (except line breaks and tabs when
/// `multiline`) and bidi / zero-width characters replaced.
pub fn clean(text: &str, multiline: bool) -> String {
    text.chars()
        .map(|c| {
            let keep_break = multiline && matches!(c, '\n' | '\t');
            if (c.is_control() && !keep_break) || is_hidden_char(c) {
                '\u{FFFD}'
            } else {
                c
            }
        })
        .collect()
}

/// One line of at most `max` characters.
pub fn line(text: &str, max: usize) -> String {
    let cleaned = clean(text, false);
    if cleaned.chars().count() > max {
        format!("{}…", cleaned.chars().take(max).collect::<String>())
    } else {
        cleaned
    }
}

/// `text` indented by `indent` on every line.
pub fn indented(text: &str, indent: &str) -> String {
    clean(text, true)
        .lines()
        .map(|l| format!("{indent}{l}"))
        .collect::<Vec<_>>()
        .join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escape_sequences_and_bidi_controls_do_not_reach_the_terminal() {
        let hostile = "hi\u{1b}]0;pwned\u{7}\u{1b}[2J\r\u{202E}txt.exe\u{9b}31m";
        let shown = clean(hostile, true);
        assert!(
            !shown.contains(['\u{1b}', '\u{7}', '\r', '\u{202E}', '\u{9b}']),
            "{shown:?}"
        );
        assert_eq!(clean("a\nb\tc", true), "a\nb\tc");
        assert_eq!(clean("a\nb", false), "a\u{FFFD}b");
        assert_eq!(line("abcdef", 3), "abc…");
        assert_eq!(indented("a\nb", "  "), "  a\n  b");
    }
}
