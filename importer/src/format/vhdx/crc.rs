//! CRC-32C (Castagnoli), the checksum of every VHDX header, region table and log entry: qemu's
//! `crc32c(0xffffffff, ...)`, which is the standard reflected CRC-32C with its final inversion.

const POLY: u32 = 0x82f6_3b78;

const fn table() -> [u32; 256] {
    let mut t = [0u32; 256];
    let mut i = 0;
    while i < 256 {
        let mut c = i as u32;
        let mut k = 0;
        while k < 8 {
            c = if c & 1 != 0 { (c >> 1) ^ POLY } else { c >> 1 };
            k += 1;
        }
        t[i] = c;
        i += 1;
    }
    t
}

static TABLE: [u32; 256] = table();

fn update(mut crc: u32, data: &[u8]) -> u32 {
    for &b in data {
        crc = TABLE[((crc ^ u32::from(b)) & 0xff) as usize] ^ (crc >> 8);
    }
    crc
}

/// The CRC-32C of `data`.
pub fn crc32c(data: &[u8]) -> u32 {
    !update(!0, data)
}

/// The checksum of a structure whose own 4-byte checksum field sits at `at`: computed with that
/// field taken as zero, as the format defines it.
pub fn structure_checksum(buf: &[u8], at: usize) -> u32 {
    let crc = update(!0, &buf[..at]);
    let crc = update(crc, &[0; 4]);
    !update(crc, &buf[at + 4..])
}

/// True when the checksum stored (little-endian) at `at` matches the structure.
pub fn checksum_is_valid(buf: &[u8], at: usize) -> bool {
    let stored = u32::from_le_bytes(buf[at..at + 4].try_into().expect("4 bytes"));
    structure_checksum(buf, at) == stored
}
