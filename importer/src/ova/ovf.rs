//! The little of an OVF descriptor an import needs: its disks, in the order the descriptor
//! gives them (`<DiskSection>`'s `<Disk ovf:fileRef=..>` mapped through `<References>`'
//! `<File ovf:id=.. ovf:href=..>`; the `<References>` order when there is no disk section).
//!
//! A small tag scanner, not an XML parser: elements and attributes are matched by local name
//! (any namespace prefix), attribute values have the five predefined entities decoded, and
//! comments, processing instructions and CDATA are skipped.

use crate::error::{Error, Result};

/// One disk of an OVF, as its files are named in the archive.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OvfDisk {
    /// `ovf:diskId` (the file's id when the OVF has no disk section).
    pub id: String,
    /// The archive member holding it (`ovf:href`).
    pub href: String,
    /// `ovf:compression` of its file (`gzip` when compressed), if any.
    pub compression: Option<String>,
    /// `ovf:chunkSize` of its file: the file is split into members `HREF.000000000`, ....
    pub chunk_size: Option<String>,
}

/// One start tag: its local name and attributes (local names, decoded values).
struct Tag {
    name: String,
    attrs: Vec<(String, String)>,
}

impl Tag {
    fn attr(&self, name: &str) -> Option<&str> {
        self.attrs
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

fn local(name: &str) -> &str {
    name.rsplit_once(':').map_or(name, |(_, l)| l)
}

/// Decodes the five predefined entities and numeric character references (`&#46;`, `&#x2e;`);
/// anything else after `&` is kept as it is.
fn decode_entities(v: &str) -> Result<String> {
    let mut out = String::with_capacity(v.len());
    let mut rest = v;
    while let Some(amp) = rest.find('&') {
        out.push_str(&rest[..amp]);
        rest = &rest[amp..];
        let Some(end) = rest.find(';') else { break };
        let name = &rest[1..end];
        let c = match name {
            "lt" => Some('<'),
            "gt" => Some('>'),
            "quot" => Some('"'),
            "apos" => Some('\''),
            "amp" => Some('&'),
            _ => match name.strip_prefix('#') {
                Some(n) => {
                    let code = match n.strip_prefix(['x', 'X']) {
                        Some(hex) => u32::from_str_radix(hex, 16).ok(),
                        None => n.parse().ok(),
                    };
                    let c = code.and_then(char::from_u32).filter(|&c| c != '\0');
                    Some(c.ok_or_else(|| {
                        Error::Corrupt(format!(
                            "OVF descriptor: &{name}; is no character reference"
                        ))
                    })?)
                }
                None => None,
            },
        };
        match c {
            Some(c) => {
                out.push(c);
                rest = &rest[end + 1..];
            }
            None => {
                out.push('&');
                rest = &rest[1..];
            }
        }
    }
    out.push_str(rest);
    Ok(out)
}

/// Most `<File>` and `<Disk>` elements read (real descriptors have a few): what the parse keeps
/// stays small whatever the descriptor holds.
const MAX_TAGS: usize = 4096;

/// The start tags of `xml` named `File` or `Disk`, in order (the others are skipped, keeping
/// nothing).
fn start_tags(xml: &str) -> Result<Vec<Tag>> {
    let bad = |why: &str| Error::Corrupt(format!("OVF descriptor: {why}"));
    let mut tags = Vec::new();
    let mut rest = xml;
    while let Some(open) = rest.find('<') {
        rest = &rest[open + 1..];
        let skip_to = |rest: &str, end: &str| rest.find(end).map(|i| i + end.len());
        let skipped = if rest.starts_with("!--") {
            Some(skip_to(rest, "-->").ok_or_else(|| bad("unterminated comment"))?)
        } else if rest.starts_with("![CDATA[") {
            Some(skip_to(rest, "]]>").ok_or_else(|| bad("unterminated CDATA"))?)
        } else if rest.starts_with('?') || rest.starts_with('!') || rest.starts_with('/') {
            Some(skip_to(rest, ">").ok_or_else(|| bad("unterminated tag"))?)
        } else {
            None
        };
        if let Some(n) = skipped {
            rest = &rest[n..];
            continue;
        }
        // A start tag: the name, then attributes up to `>` (quoted values may hold `>`).
        let name_end = rest
            .find(|c: char| c.is_whitespace() || c == '>' || c == '/')
            .ok_or_else(|| bad("unterminated tag"))?;
        let name = local(&rest[..name_end]);
        let keep = name == "File" || name == "Disk";
        if keep && tags.len() == MAX_TAGS {
            return Err(Error::Unsupported(format!(
                "OVF descriptor: more than {MAX_TAGS} <File> and <Disk> elements"
            )));
        }
        let mut tag = Tag {
            name: name.to_string(),
            attrs: Vec::new(),
        };
        rest = &rest[name_end..];
        loop {
            rest = rest.trim_start();
            if let Some(r) = rest.strip_prefix("/>").or_else(|| rest.strip_prefix('>')) {
                rest = r;
                break;
            }
            let eq = rest
                .find('=')
                .ok_or_else(|| bad("an attribute without a value"))?;
            let key = local(rest[..eq].trim());
            rest = rest[eq + 1..].trim_start();
            let quote = rest
                .chars()
                .next()
                .filter(|c| *c == '"' || *c == '\'')
                .ok_or_else(|| bad("an unquoted attribute value"))?;
            let close = rest[1..]
                .find(quote)
                .ok_or_else(|| bad("an unterminated attribute value"))?;
            if keep {
                tag.attrs
                    .push((key.to_string(), decode_entities(&rest[1..1 + close])?));
            }
            rest = &rest[close + 2..];
        }
        if keep {
            tags.push(tag);
        }
    }
    Ok(tags)
}

/// The disks of an OVF descriptor, in its order (see the module docs).
pub fn disks(xml: &str) -> Result<Vec<OvfDisk>> {
    let tags = start_tags(xml)?;
    let files: Vec<&Tag> = tags.iter().filter(|t| t.name == "File").collect();
    let file = |id: &str| files.iter().find(|f| f.attr("id") == Some(id));
    let disk_tags: Vec<&Tag> = tags.iter().filter(|t| t.name == "Disk").collect();
    let mut disks = Vec::new();
    if disk_tags.is_empty() {
        for f in &files {
            let href = f.attr("href").ok_or_else(|| {
                Error::Corrupt("OVF descriptor: a <File> without ovf:href".into())
            })?;
            disks.push(OvfDisk {
                id: f.attr("id").unwrap_or(href).to_string(),
                href: href.to_string(),
                compression: f.attr("compression").map(str::to_string),
                chunk_size: f.attr("chunkSize").map(str::to_string),
            });
        }
    } else {
        for d in disk_tags {
            let id = d.attr("diskId").unwrap_or_default();
            // A disk without a file is a blank disk the VM creates: nothing to import.
            let Some(file_ref) = d.attr("fileRef") else {
                continue;
            };
            let f = file(file_ref).ok_or_else(|| {
                Error::Corrupt(format!(
                    "OVF descriptor: disk {id:?} refers to file {file_ref:?}, which <References> does not list"
                ))
            })?;
            let href = f.attr("href").ok_or_else(|| {
                Error::Corrupt(format!("OVF descriptor: file {file_ref:?} has no ovf:href"))
            })?;
            disks.push(OvfDisk {
                id: id.to_string(),
                href: href.to_string(),
                compression: f.attr("compression").map(str::to_string),
                chunk_size: f.attr("chunkSize").map(str::to_string),
            });
        }
    }
    if disks.is_empty() {
        return Err(Error::Unsupported(
            "the OVF descriptor lists no disk file to import".into(),
        ));
    }
    Ok(disks)
}

#[cfg(test)]
mod tests {
    use super::*;

    const OVF: &str = r#"<?xml version="1.0" encoding="UTF-8"?>
<!-- made by hand: <Disk> in a comment is ignored -->
<Envelope xmlns="http://schemas.dmtf.org/ovf/envelope/1" xmlns:ovf="http://schemas.dmtf.org/ovf/envelope/1">
  <References>
    <File ovf:id="file2" ovf:href="data &amp; logs.vmdk"/>
    <File ovf:href='system.vmdk' ovf:id='file1' ovf:size="1024" />
  </References>
  <DiskSection>
    <Info>Virtual disk information > here</Info>
    <Disk ovf:capacity="10" ovf:diskId="vmdisk1" ovf:fileRef="file1" ovf:format="http://www.vmware.com/interfaces/specifications/vmdk.html#streamOptimized"/>
    <Disk ovf:capacity="5" ovf:diskId="scratch"/>
    <Disk ovf:capacity="20" ovf:diskId="vmdisk2" ovf:fileRef="file2"/>
  </DiskSection>
</Envelope>"#;

    #[test]
    fn disks_come_in_disk_section_order_through_references() {
        let d = disks(OVF).unwrap();
        let hrefs: Vec<_> = d.iter().map(|d| d.href.as_str()).collect();
        assert_eq!(hrefs, ["system.vmdk", "data & logs.vmdk"]);
        assert_eq!(d[0].id, "vmdisk1");
    }

    #[test]
    fn without_a_disk_section_the_references_order_counts() {
        let xml = r#"<Envelope><References><File id="a" href="a.qcow2" compression="gzip"/><File id="b" href="b.img"/></References></Envelope>"#;
        let d = disks(xml).unwrap();
        assert_eq!(d[0].href, "a.qcow2");
        assert_eq!(d[0].compression.as_deref(), Some("gzip"));
        assert_eq!(d[1].href, "b.img");
    }

    #[test]
    fn character_references_in_values_are_decoded() {
        let xml = r#"<Envelope><References><File id="a" href="disk&#46;vmdk"/><File id="b" href="&#x64;&#X69;sk&amp;&lt;2&gt;.vmdk"/><File id="c" href="a&b;c"/></References></Envelope>"#;
        let hrefs: Vec<_> = disks(xml).unwrap().into_iter().map(|d| d.href).collect();
        assert_eq!(hrefs, ["disk.vmdk", "disk&<2>.vmdk", "a&b;c"]);
        for bad in ["&#0;", "&#xd800;", "&#99999999999;", "&#x;"] {
            let xml = format!(r#"<Envelope><File id="a" href="d{bad}"/></Envelope>"#);
            assert_eq!(
                disks(&xml).unwrap_err().kind(),
                crate::ErrorKind::CorruptImage,
                "{bad}"
            );
        }
    }

    #[test]
    fn only_file_and_disk_elements_are_kept_and_a_few_thousand_at_most() {
        let many = "<Item/>".repeat(1 << 20);
        let xml = format!(
            r#"<Envelope>{many}<References><File id="a" href="a.vmdk"/></References></Envelope>"#
        );
        assert_eq!(disks(&xml).unwrap()[0].href, "a.vmdk");
        let files = r#"<File id="a" href="a.vmdk"/>"#.repeat(MAX_TAGS + 1);
        let e = disks(&format!("<Envelope>{files}</Envelope>")).unwrap_err();
        assert_eq!(e.kind(), crate::ErrorKind::Unsupported, "{e}");
    }

    #[test]
    fn broken_descriptors_are_refused() {
        for bad in [
            "<Envelope><DiskSection><Disk ovf:diskId=\"d\" ovf:fileRef=\"nope\"/></DiskSection></Envelope>",
            "<Envelope><File ovf:id=\"f\"",
            "<Envelope><File ovf:id=f/></Envelope>",
        ] {
            let e = disks(bad).unwrap_err();
            assert_eq!(e.kind(), crate::ErrorKind::CorruptImage, "{bad}: {e}");
        }
        assert_eq!(
            disks("<Envelope/>").unwrap_err().kind(),
            crate::ErrorKind::Unsupported
        );
    }
}
