//! Percent-decoding of URL parts (user info, S3 keys, header names): `%XX` becomes the byte
//! XX; anything else, a lone `%` included, stays as it is; `+` stays `+` (this is not form
//! decoding). Bytes that are not UTF-8 become U+FFFD. And the strict encoding object stores
//! want (S3 signatures, S3 and GCS object paths, form values).

/// Encodes every byte of `s` but RFC 3986's unreserved `A-Za-z0-9-._~` as `%XX` (upper-case
/// hex); `/` too unless `keep_slash`.
pub fn percent_encode(s: &str, keep_slash: bool) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                out.push(b as char)
            }
            b'/' if keep_slash => out.push('/'),
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

/// Decodes `%XX` escapes in `s`.
pub fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%'
            && i + 2 < b.len()
            && let (Some(h), Some(l)) = (hex_val(b[i + 1]), hex_val(b[i + 2]))
        {
            out.push(h << 4 | l);
            i += 3;
            continue;
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn hex_val(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        b'A'..=b'F' => Some(c - b'A' + 10),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn userinfo_is_percent_decoded() {
        assert_eq!(percent_decode("a%40b%3Ac"), "a@b:c");
        assert_eq!(percent_decode("100%"), "100%");
    }

    #[test]
    fn encoding_is_strict_and_decodes_back() {
        let s = "dir/a b+c&d=é~_.-";
        assert_eq!(percent_encode(s, true), "dir/a%20b%2Bc%26d%3D%C3%A9~_.-");
        assert_eq!(percent_encode("a/b:c", false), "a%2Fb%3Ac");
        assert_eq!(percent_decode(&percent_encode(s, false)), s);
    }

    #[test]
    fn plus_ampersand_and_bad_escapes_stay_as_they_are() {
        assert_eq!(percent_decode("a+b&c=d"), "a+b&c=d");
        assert_eq!(percent_decode("%zz%4"), "%zz%4");
        assert_eq!(percent_decode("Scopes%2Fa"), "Scopes/a");
        assert_eq!(percent_decode("%C3%A9"), "é");
        assert_eq!(percent_decode("%FF"), "\u{FFFD}");
    }
}
