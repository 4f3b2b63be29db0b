//! Text that a runtime or a bridge controls (status reasons, error messages, stderr tails, hello
//! fields) is stored and shown capped: unbounded, one hostile runtime's 4 MB failure message made
//! every ListSessions answer larger than the gRPC message limit. A capped text says so.

use std::borrow::Cow;

/// Bytes kept of one runtime- or bridge-controlled text.
pub const MAX_FOREIGN_TEXT_BYTES: usize = 4 * 1024;

/// What ends a text that was cut.
pub const CUT_MARK: &str = " …[cut]";

/// `text` if it is at most `max` bytes; otherwise its longest prefix (on a character boundary)
/// that leaves room for [`CUT_MARK`], followed by the mark, `max` bytes at most in all.
pub fn cap(text: &str, max: usize) -> Cow<'_, str> {
    if text.len() <= max {
        return Cow::Borrowed(text);
    }
    let mut end = max.saturating_sub(CUT_MARK.len());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    Cow::Owned(format!("{}{CUT_MARK}", &text[..end]))
}

/// [`cap`] at [`MAX_FOREIGN_TEXT_BYTES`], owned.
pub fn cap_foreign(text: &str) -> String {
    cap(text, MAX_FOREIGN_TEXT_BYTES).into_owned()
}

/// [`cap_foreign`] in place, without copying a text that fits.
pub fn cap_foreign_in_place(text: &mut String) {
    if text.len() > MAX_FOREIGN_TEXT_BYTES {
        *text = cap_foreign(text);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_text_that_fits_is_kept_as_it_is() {
        assert!(matches!(cap("short", 10), Cow::Borrowed("short")));
        let exact = "x".repeat(MAX_FOREIGN_TEXT_BYTES);
        assert_eq!(cap_foreign(&exact), exact);
    }

    #[test]
    fn a_longer_text_is_cut_to_the_cap_and_marked_as_cut() {
        let long = "y".repeat(4 * 1024 * 1024);
        let capped = cap_foreign(&long);
        assert!(capped.len() <= MAX_FOREIGN_TEXT_BYTES);
        assert!(capped.ends_with(CUT_MARK));
        assert!(capped.starts_with("yyyy"));
    }

    #[test]
    fn a_cut_never_splits_a_character() {
        let long = "é".repeat(5000);
        let capped = cap_foreign(&long);
        assert!(capped.len() <= MAX_FOREIGN_TEXT_BYTES);
        assert!(capped.ends_with(CUT_MARK));
        let mut in_place = long.clone();
        cap_foreign_in_place(&mut in_place);
        assert_eq!(in_place, capped);
    }
}
