//! The encoder and decoder against RFC 7541 Appendix C, each decoding error from a
//! crafted block, cut blocks, the list limit, size updates, and random round trips.

use super::*;

/// Bytes from hex, spaces and newlines ignored (the RFC's layout).
fn hex(text: &str) -> Vec<u8> {
    let digits: Vec<u8> = text.bytes().filter(|b| !b.is_ascii_whitespace()).collect();
    digits
        .chunks(2)
        .map(|pair| u8::from_str_radix(std::str::from_utf8(pair).unwrap(), 16).unwrap())
        .collect()
}

/// A field as text, for comparisons.
type Field = (String, String);

fn text(name: &[u8], value: &[u8]) -> Field {
    (
        String::from_utf8_lossy(name).into_owned(),
        String::from_utf8_lossy(value).into_owned(),
    )
}

fn fields(list: &[(&str, &str)]) -> Vec<Field> {
    list.iter()
        .map(|(n, v)| ((*n).to_owned(), (*v).to_owned()))
        .collect()
}

/// Decodes `block`: the fields handed out, and the result.
fn decode(
    decoder: &mut Decoder,
    block: &[u8],
    limit: usize,
) -> (Vec<Field>, Result<(), DecodeError>) {
    let mut got = Vec::new();
    let result = decoder.decode(&Bytes::copy_from_slice(block), limit, |n, v| {
        got.push(text(&n, &v))
    });
    (got, result)
}

/// The decoder's dynamic table, newest first.
fn table_of(decoder: &Decoder) -> Vec<Field> {
    decoder.table.iter().map(|(n, v)| text(n, v)).collect()
}

/// One block of a sequence in Appendix C: its bytes, the fields, then the dynamic
/// table (newest first) and its size after it.
struct Step {
    block: &'static str,
    fields: &'static [(&'static str, &'static str)],
    table: &'static [(&'static str, &'static str)],
    size: usize,
}

/// Decodes the steps in order with one decoder of `table_size`, checking each.
fn check_decoder(table_size: usize, steps: &[Step]) {
    let mut decoder = Decoder::new(table_size);
    for (i, step) in steps.iter().enumerate() {
        let (got, result) = decode(&mut decoder, &hex(step.block), usize::MAX);
        assert_eq!(result, Ok(()), "step {i}");
        assert_eq!(got, fields(step.fields), "step {i}");
        assert_eq!(table_of(&decoder), fields(step.table), "step {i}");
        assert_eq!(decoder.table.size(), step.size, "step {i}");
    }
}

/// Encodes the steps' fields with `indexing` and one encoder (whose peer allows
/// `table_size`): each block decodes back to the fields, the tables match the steps',
/// and with `exact`, the blocks are the RFC's bytes (after the first block's size
/// update, if any).
fn check_encoder(table_size: u32, steps: &[Step], indexing: Indexing, exact: bool) {
    let mut encoder = Encoder::new();
    encoder.set_max_table_size(table_size);
    let mut decoder = Decoder::new(4096);
    for (i, step) in steps.iter().enumerate() {
        let mut block = BytesMut::new();
        encoder.begin_block(&mut block);
        let update = block.len();
        if i > 0 {
            assert_eq!(update, 0, "step {i}: a size update again");
        }
        for (name, value) in step.fields {
            encoder.encode(name.as_bytes(), value.as_bytes(), indexing, &mut block);
        }
        if exact {
            assert_eq!(block[update..], hex(step.block)[..], "step {i}");
        }
        let (got, result) = decode(&mut decoder, &block, usize::MAX);
        assert_eq!(result, Ok(()), "step {i}");
        assert_eq!(got, fields(step.fields), "step {i}");
        if indexing == Indexing::Incremental {
            assert_eq!(table_of(&decoder), fields(step.table), "step {i}");
            assert_eq!(encoder.table.size(), step.size, "step {i}");
        }
        assert_same_tables(&encoder, &decoder);
    }
}

/// The encoder's table is the decoder's.
fn assert_same_tables(encoder: &Encoder, decoder: &Decoder) {
    let enc: Vec<Field> = encoder.table.iter().map(|(n, v)| text(n, v)).collect();
    assert_eq!(enc, table_of(decoder));
    assert_eq!(encoder.table.size(), decoder.table.size());
    assert_eq!(encoder.table.max_size(), decoder.table.max_size());
}

const REQUEST_1: &[(&str, &str)] = &[
    (":method", "GET"),
    (":scheme", "http"),
    (":path", "/"),
    (":authority", "www.example.com"),
];
const REQUEST_2: &[(&str, &str)] = &[
    (":method", "GET"),
    (":scheme", "http"),
    (":path", "/"),
    (":authority", "www.example.com"),
    ("cache-control", "no-cache"),
];
const REQUEST_3: &[(&str, &str)] = &[
    (":method", "GET"),
    (":scheme", "https"),
    (":path", "/index.html"),
    (":authority", "www.example.com"),
    ("custom-key", "custom-value"),
];
const REQUEST_TABLE_1: &[(&str, &str)] = &[(":authority", "www.example.com")];
const REQUEST_TABLE_2: &[(&str, &str)] = &[
    ("cache-control", "no-cache"),
    (":authority", "www.example.com"),
];
const REQUEST_TABLE_3: &[(&str, &str)] = &[
    ("custom-key", "custom-value"),
    ("cache-control", "no-cache"),
    (":authority", "www.example.com"),
];

/// C.3: requests without Huffman.
const C3: [Step; 3] = [
    Step {
        block: "8286 8441 0f77 7777 2e65 7861 6d70 6c65
                2e63 6f6d",
        fields: REQUEST_1,
        table: REQUEST_TABLE_1,
        size: 57,
    },
    Step {
        block: "8286 84be 5808 6e6f 2d63 6163 6865",
        fields: REQUEST_2,
        table: REQUEST_TABLE_2,
        size: 110,
    },
    Step {
        block: "8287 85bf 400a 6375 7374 6f6d 2d6b 6579
                0c63 7573 746f 6d2d 7661 6c75 65",
        fields: REQUEST_3,
        table: REQUEST_TABLE_3,
        size: 164,
    },
];

/// C.4: the same requests with Huffman.
const C4: [Step; 3] = [
    Step {
        block: "8286 8441 8cf1 e3c2 e5f2 3a6b a0ab 90f4
                ff",
        fields: REQUEST_1,
        table: REQUEST_TABLE_1,
        size: 57,
    },
    Step {
        block: "8286 84be 5886 a8eb 1064 9cbf",
        fields: REQUEST_2,
        table: REQUEST_TABLE_2,
        size: 110,
    },
    Step {
        block: "8287 85bf 4088 25a8 49e9 5ba9 7d7f 8925
                a849 e95b b8e8 b4bf",
        fields: REQUEST_3,
        table: REQUEST_TABLE_3,
        size: 164,
    },
];

const DATE_21: &str = "Mon, 21 Oct 2013 20:13:21 GMT";
const DATE_22: &str = "Mon, 21 Oct 2013 20:13:22 GMT";
const LOCATION: &str = "https://www.example.com";
const COOKIE: &str = "foo=ASDJKHQKBZXOQWEOPIUAXQWEOIU; max-age=3600; version=1";
const RESPONSE_1: &[(&str, &str)] = &[
    (":status", "302"),
    ("cache-control", "private"),
    ("date", DATE_21),
    ("location", LOCATION),
];
const RESPONSE_2: &[(&str, &str)] = &[
    (":status", "307"),
    ("cache-control", "private"),
    ("date", DATE_21),
    ("location", LOCATION),
];
const RESPONSE_3: &[(&str, &str)] = &[
    (":status", "200"),
    ("cache-control", "private"),
    ("date", DATE_22),
    ("location", LOCATION),
    ("content-encoding", "gzip"),
    ("set-cookie", COOKIE),
];
const RESPONSE_TABLE_1: &[(&str, &str)] = &[
    ("location", LOCATION),
    ("date", DATE_21),
    ("cache-control", "private"),
    (":status", "302"),
];
const RESPONSE_TABLE_2: &[(&str, &str)] = &[
    (":status", "307"),
    ("location", LOCATION),
    ("date", DATE_21),
    ("cache-control", "private"),
];
const RESPONSE_TABLE_3: &[(&str, &str)] = &[
    ("set-cookie", COOKIE),
    ("content-encoding", "gzip"),
    ("date", DATE_22),
];

/// C.5: responses without Huffman, in a 256-byte table (evictions).
const C5: [Step; 3] = [
    Step {
        block: "4803 3330 3258 0770 7269 7661 7465 611d
                4d6f 6e2c 2032 3120 4f63 7420 3230 3133
                2032 303a 3133 3a32 3120 474d 546e 1768
                7474 7073 3a2f 2f77 7777 2e65 7861 6d70
                6c65 2e63 6f6d",
        fields: RESPONSE_1,
        table: RESPONSE_TABLE_1,
        size: 222,
    },
    Step {
        block: "4803 3330 37c1 c0bf",
        fields: RESPONSE_2,
        table: RESPONSE_TABLE_2,
        size: 222,
    },
    Step {
        block: "88c1 611d 4d6f 6e2c 2032 3120 4f63 7420
                3230 3133 2032 303a 3133 3a32 3220 474d
                54c0 5a04 677a 6970 7738 666f 6f3d 4153
                444a 4b48 514b 425a 584f 5157 454f 5049
                5541 5851 5745 4f49 553b 206d 6178 2d61
                6765 3d33 3630 303b 2076 6572 7369 6f6e
                3d31",
        fields: RESPONSE_3,
        table: RESPONSE_TABLE_3,
        size: 215,
    },
];

/// C.6: the same responses with Huffman.
const C6: [Step; 3] = [
    Step {
        block: "4882 6402 5885 aec3 771a 4b61 96d0 7abe
                9410 54d4 44a8 2005 9504 0b81 66e0 82a6
                2d1b ff6e 919d 29ad 1718 63c7 8f0b 97c8
                e9ae 82ae 43d3",
        fields: RESPONSE_1,
        table: RESPONSE_TABLE_1,
        size: 222,
    },
    Step {
        block: "4883 640e ffc1 c0bf",
        fields: RESPONSE_2,
        table: RESPONSE_TABLE_2,
        size: 222,
    },
    Step {
        block: "88c1 6196 d07a be94 1054 d444 a820 0595
                040b 8166 e084 a62d 1bff c05a 839b d9ab
                77ad 94e7 821d d7f2 e6c7 b335 dfdf cd5b
                3960 d5af 2708 7f36 72c1 ab27 0fb5 291f
                9587 3160 65c0 03ed 4ee5 b106 3d50 07",
        fields: RESPONSE_3,
        table: RESPONSE_TABLE_3,
        size: 215,
    },
];

/// Reads one integer from `bytes` with a `prefix`-bit prefix: the value and the
/// octets read.
fn read_int(bytes: &[u8], prefix: u32) -> Result<(usize, usize), DecodeError> {
    let block = Bytes::copy_from_slice(bytes);
    let mut reader = Reader {
        block: &block,
        pos: 0,
    };
    let value = reader.int(prefix)?;
    Ok((value, reader.pos))
}

fn write_int(high: u8, prefix: u32, value: usize) -> Vec<u8> {
    let mut dst = BytesMut::new();
    encode_int(&mut dst, high, prefix, value);
    dst.to_vec()
}

#[test]
fn c1_integers() {
    // C.1.1: 10 with a 5-bit prefix; C.1.2: 1337 with a 5-bit prefix; C.1.3: 42 at an
    // octet boundary (an 8-bit prefix).
    assert_eq!(write_int(0, 5, 10), [0x0a]);
    assert_eq!(write_int(0, 5, 1337), [0x1f, 0x9a, 0x0a]);
    assert_eq!(write_int(0, 8, 42), [0x2a]);
    assert_eq!(read_int(&[0x0a], 5), Ok((10, 1)));
    assert_eq!(read_int(&[0x1f, 0x9a, 0x0a], 5), Ok((1337, 3)));
    assert_eq!(read_int(&[0x2a], 8), Ok((42, 1)));
    // The bits above the prefix are the representation's, not the integer's.
    assert_eq!(write_int(0xe0, 5, 10), [0xea]);
    assert_eq!(read_int(&[0xea], 5), Ok((10, 1)));
    // The prefix's maximum takes a zero continuation octet.
    assert_eq!(write_int(0, 5, 31), [0x1f, 0x00]);
    assert_eq!(read_int(&[0x1f, 0x00], 5), Ok((31, 2)));
}

#[test]
fn integers_round_trip_and_overflow() {
    let values = [
        0,
        1,
        14,
        15,
        16,
        30,
        31,
        32,
        126,
        127,
        128,
        255,
        256,
        16_383,
        16_384,
        1 << 21,
        1 << 28,
    ];
    for prefix in 1..=8 {
        for &value in values
            .iter()
            .chain(&[u32::MAX as usize - 1, u32::MAX as usize])
        {
            let bytes = write_int(0, prefix, value);
            assert_eq!(
                read_int(&bytes, prefix),
                Ok((value, bytes.len())),
                "{value} in {prefix}"
            );
            // Cut anywhere, it is an error.
            for cut in 0..bytes.len() {
                assert_eq!(read_int(&bytes[..cut], prefix), Err(DecodeError::Truncated));
            }
        }
        let over = write_int(0, prefix, u32::MAX as usize + 1);
        assert_eq!(
            read_int(&over, prefix),
            Err(DecodeError::IntegerOverflow),
            "{prefix}"
        );
    }
    // Six octets after the prefix, even of zeros, is too long.
    assert_eq!(
        read_int(&[0x1f, 0x80, 0x80, 0x80, 0x80, 0x80, 0x00], 5),
        Err(DecodeError::IntegerOverflow)
    );
    assert_eq!(
        read_int(&[0x1f, 0x80, 0x80, 0x80, 0x80, 0x00], 5),
        Ok((31, 6))
    );
    // The largest fifth octet.
    assert_eq!(
        read_int(&[0x1f, 0xff, 0xff, 0xff, 0xff, 0x7f], 5),
        Err(DecodeError::IntegerOverflow)
    );
}

#[test]
fn c2_literals() {
    let cases: [(&str, (&str, &str), Indexing, usize); 4] = [
        // C.2.1: literal with indexing, a literal name.
        (
            "400a 6375 7374 6f6d 2d6b 6579 0d63 7573 746f 6d2d 6865 6164 6572",
            ("custom-key", "custom-header"),
            Indexing::Incremental,
            55,
        ),
        // C.2.2: without indexing, an indexed name.
        (
            "040c 2f73 616d 706c 652f 7061 7468",
            (":path", "/sample/path"),
            Indexing::No,
            0,
        ),
        // C.2.3: never indexed.
        (
            "1008 7061 7373 776f 7264 0673 6563 7265 74",
            ("password", "secret"),
            Indexing::Never,
            0,
        ),
        // C.2.4: indexed.
        ("82", (":method", "GET"), Indexing::Incremental, 0),
    ];
    for (block, (name, value), indexing, size) in cases {
        let mut decoder = Decoder::new(4096);
        let (got, result) = decode(&mut decoder, &hex(block), usize::MAX);
        assert_eq!(result, Ok(()), "{block}");
        assert_eq!(got, fields(&[(name, value)]));
        assert_eq!(decoder.table.size(), size);
        assert_eq!(decoder.table.len(), usize::from(size > 0));
        let mut encoder = Encoder::new();
        let mut dst = BytesMut::new();
        encoder.begin_block(&mut dst);
        encoder.encode(name.as_bytes(), value.as_bytes(), indexing, &mut dst);
        assert_eq!(dst[..], hex(block)[..], "{name}");
        assert_eq!(encoder.table.size(), size);
    }
}

#[test]
fn c3_requests_without_huffman() {
    check_decoder(4096, &C3);
    check_encoder(4096, &C3, Indexing::Incremental, true);
}

#[test]
fn c4_requests_with_huffman() {
    check_decoder(4096, &C4);
    check_encoder(4096, &C4, Indexing::Incremental, false);
    check_encoder(4096, &C4, Indexing::No, false);
    check_encoder(4096, &C4, Indexing::Never, false);
}

#[test]
fn c5_responses_without_huffman() {
    check_decoder(256, &C5);
    check_encoder(256, &C5, Indexing::Incremental, true);
    // The encoder told the decoder about the 256 bytes first.
    let mut encoder = Encoder::new();
    encoder.set_max_table_size(256);
    let mut dst = BytesMut::new();
    encoder.begin_block(&mut dst);
    assert_eq!(dst[..], [0x3f, 0xe1, 0x01]);
}

#[test]
fn c6_responses_with_huffman() {
    check_decoder(256, &C6);
    check_encoder(256, &C6, Indexing::Incremental, false);
    check_encoder(256, &C6, Indexing::Never, false);
}

#[test]
fn the_rfc_examples_never_add_with_no_or_never() {
    // Fields sent without indexing leave the decoder's table empty.
    let mut encoder = Encoder::new();
    let mut decoder = Decoder::new(4096);
    for step in &C5 {
        for indexing in [Indexing::No, Indexing::Never] {
            let mut block = BytesMut::new();
            encoder.begin_block(&mut block);
            for (name, value) in step.fields {
                encoder.encode(name.as_bytes(), value.as_bytes(), indexing, &mut block);
            }
            let (got, result) = decode(&mut decoder, &block, usize::MAX);
            assert_eq!((got, result), (fields(step.fields), Ok(())));
            assert_eq!(decoder.table.len(), 0);
        }
    }
}

#[test]
fn never_indexed_fields_are_never_sent_as_an_index() {
    let mut encoder = Encoder::new();
    let mut dst = BytesMut::new();
    encoder.begin_block(&mut dst);
    // A whole static match: its name's index, never-indexed (0001), the value.
    encoder.encode(b":method", b"GET", Indexing::Never, &mut dst);
    assert_eq!(dst[..], [0x12, 0x03, b'G', b'E', b'T']);
    // A whole dynamic match: the same, with the dynamic name (62 = 15 + 47).
    encoder.encode(b"token", b"secret", Indexing::Incremental, &mut dst);
    let before = dst.len();
    encoder.encode(b"token", b"secret", Indexing::Never, &mut dst);
    assert_eq!(dst[before..], hex("1f 2f 06 7365 6372 6574"));
    // Without Never, the whole field is an index.
    let before = dst.len();
    encoder.encode(b"token", b"secret", Indexing::No, &mut dst);
    assert_eq!(dst[before..], [0xbe]);
    let (got, result) = decode(&mut Decoder::new(4096), &dst, usize::MAX);
    assert_eq!(result, Ok(()));
    assert_eq!(
        got,
        fields(&[
            (":method", "GET"),
            ("token", "secret"),
            ("token", "secret"),
            ("token", "secret")
        ])
    );
}

/// Decodes `block` with a fresh decoder of 4096 bytes.
fn decode_fresh(block: &[u8]) -> Result<Vec<Field>, DecodeError> {
    let (got, result) = decode(&mut Decoder::new(4096), block, usize::MAX);
    result.map(|()| got)
}

#[test]
fn each_error_from_a_crafted_block() {
    use DecodeError::*;
    let cases: &[(&str, DecodeError)] = &[
        // An index whose continuation octet is missing.
        ("82 ff", Truncated),
        // A literal with no name after its first octet.
        ("40", Truncated),
        // A literal with an indexed name and no value.
        ("44", Truncated),
        // Index 4294967327 (over 2^32 - 1).
        ("ff ff ff ff ff 1f", IntegerOverflow),
        // Six continuation octets.
        ("ff 80 80 80 80 80 00", IntegerOverflow),
        // A string length past 2^32.
        ("00 ff ff ff ff ff 1f", IntegerOverflow),
        ("80", IndexZero),
        // 62: the dynamic table is empty.
        ("be", IndexOutOfRange),
        // A name at index 70.
        ("7f 07 01 61", IndexOutOfRange),
        ("00 01 61 84 ffff ffff", Huffman(HuffmanError::Eos)),
        ("00 01 61 81 ff", Huffman(HuffmanError::PaddingTooLong)),
        ("00 01 61 81 00", Huffman(HuffmanError::PaddingNotOnes)),
        // The Huffman name is checked too.
        ("00 81 00 01 61", Huffman(HuffmanError::PaddingNotOnes)),
        // 4097 > 4096.
        ("3f e2 1f", SizeUpdateTooLarge),
        ("82 20", SizeUpdateNotAtStart),
        ("20 20 20", TooManySizeUpdates),
        // A value of 5 bytes with 1 left.
        ("00 01 61 05 61", StringTooLong),
        // A Huffman name of 2^31 bytes or so.
        ("00 ff ff ff ff ff 07", StringTooLong),
    ];
    for &(block, error) in cases {
        assert_eq!(decode_fresh(&hex(block)), Err(error), "{block}");
        assert!(error.is_connection_error());
        assert!(!error.to_string().is_empty());
    }
    // The largest size update allowed, and two at the start.
    assert_eq!(
        decode_fresh(&hex("20 3f e1 1f 82")),
        Ok(fields(&[(":method", "GET")]))
    );
    assert!(!DecodeError::ListTooLarge.is_connection_error());
    let (got, result) = decode(&mut Decoder::new(4096), &hex("82"), 10);
    assert_eq!((got, result), (Vec::new(), Err(DecodeError::ListTooLarge)));
}

/// Checks every cut of `block` against `all` (its fields): a cut at one of `ends`
/// (an offset, and how many fields end before it) decodes to those fields, a cut
/// anywhere else is a connection error.
fn check_cuts(block: &[u8], ends: &[(usize, usize)], all: &[Field]) {
    for cut in 0..block.len() {
        let result = decode_fresh(&block[..cut]);
        match ends.iter().find(|&&(end, _)| end == cut) {
            Some(&(_, n)) => assert_eq!(result, Ok(all[..n].to_vec()), "cut at {cut}"),
            None => assert!(
                result.as_ref().is_err_and(|e| e.is_connection_error()),
                "cut at {cut}: {result:?}"
            ),
        }
    }
}

#[test]
fn cut_blocks_are_errors_or_shorter_lists() {
    // Blocks the encoder writes (a size update, then the fields), with the offset
    // after each field.
    let long = "v".repeat(300);
    let list: Vec<Field> = fields(&[
        (":method", "POST"),
        (":path", "/pkg.Service/Method"),
        ("content-type", "application/grpc"),
        ("te", "trailers"),
        ("x-long", &long),
        ("authorization", "Bearer abc"),
    ]);
    for indexing in [Indexing::Incremental, Indexing::No, Indexing::Never] {
        let mut encoder = Encoder::new();
        encoder.set_max_table_size(1000);
        let mut block = BytesMut::new();
        encoder.begin_block(&mut block);
        assert_eq!(block.len(), 3);
        let mut ends = vec![(0, 0), (block.len(), 0)];
        for (name, value) in &list {
            encoder.encode(name.as_bytes(), value.as_bytes(), indexing, &mut block);
            ends.push((block.len(), ends.len() - 1));
        }
        check_cuts(&block, &ends, &list);
    }
    // The RFC's blocks (first of each sequence, on a fresh decoder): every cut is an
    // error or a shorter list, never a panic.
    for steps in [&C3, &C4, &C5, &C6] {
        let block = hex(steps[0].block);
        let all = fields(steps[0].fields);
        for cut in 0..block.len() {
            if let Ok(got) = decode_fresh(&block[..cut]) {
                assert_eq!(got[..], all[..got.len()], "cut at {cut}");
            }
        }
    }
}

#[test]
fn list_too_large_keeps_the_table_in_step() {
    let mut decoder = Decoder::new(4096);
    // C.2.1's field is 55 bytes: over a limit of 50. It is still added.
    let block = hex("82 400a 6375 7374 6f6d 2d6b 6579 0d63 7573 746f 6d2d 6865 6164 6572 84");
    let (got, result) = decode(&mut decoder, &block, 50);
    assert_eq!(result, Err(DecodeError::ListTooLarge));
    // The field before it came out; none after.
    assert_eq!(got, fields(&[(":method", "GET")]));
    assert_eq!(
        table_of(&decoder),
        fields(&[("custom-key", "custom-header")])
    );
    // The next block uses it.
    let (got, result) = decode(&mut decoder, &hex("be"), 100);
    assert_eq!(result, Ok(()));
    assert_eq!(got, fields(&[("custom-key", "custom-header")]));
}

#[test]
fn list_too_large_with_huffman_strings_keeps_the_table_in_step() {
    // Encode blocks whose Huffman fields go over a small list limit: some fit the
    // table (added), one is larger than the table (empties it). A decoder with the
    // limit and one without must end with the same tables, block after block.
    let huff = |s: &[u8], dst: &mut BytesMut| {
        let mut code = BytesMut::new();
        huffman::encode(s, &mut code);
        encode_int(dst, 0x80, 7, code.len());
        dst.extend_from_slice(&code);
    };
    let mut blocks = Vec::new();
    for (name, value) in [
        ("a", "short"),
        ("big-name-huffman", &"x".repeat(200)[..]),
        ("b", "short"),
        ("too-big-for-table", &"y".repeat(400)[..]),
        ("c", "after"),
    ] {
        let mut block = BytesMut::new();
        block.put_u8(0x40);
        huff(name.as_bytes(), &mut block);
        huff(value.as_bytes(), &mut block);
        // And a reference to the newest entry, if any.
        block.put_u8(0xbe);
        blocks.push(block.freeze());
    }
    let mut limited = Decoder::new(256);
    let mut reference = Decoder::new(256);
    for (i, block) in blocks.iter().enumerate() {
        let (all, full) = decode(&mut reference, block, usize::MAX);
        let (got, result) = decode(&mut limited, block, 64);
        assert_eq!(table_of(&limited), table_of(&reference), "block {i}");
        assert_eq!(limited.table.size(), reference.table.size());
        match full {
            Ok(()) => {
                let size: usize = all.iter().map(|(n, v)| field_size(n.len(), v.len())).sum();
                assert_eq!(result.is_ok(), size <= 64, "block {i}");
                assert!(got.len() <= all.len());
                assert_eq!(got[..], all[..got.len()]);
            }
            // The field larger than the table emptied it: the reference is empty.
            Err(err) => {
                assert_eq!(err, DecodeError::IndexOutOfRange, "block {i}");
                assert_eq!(i, 3);
                assert!(result.is_err());
            }
        }
    }
}

#[test]
fn fields_after_the_limit_are_not_handed_out() {
    let mut decoder = Decoder::new(4096);
    // :method GET (42 bytes), :path / (38), x-padding (341), :scheme http (43).
    let mut block = BytesMut::new();
    let mut encoder = Encoder::new();
    encoder.encode(b":method", b"GET", Indexing::No, &mut block);
    encoder.encode(b":path", b"/", Indexing::No, &mut block);
    encoder.encode(b"x-padding", &[b'p'; 300], Indexing::No, &mut block);
    encoder.encode(b":scheme", b"http", Indexing::No, &mut block);
    let (got, result) = decode(&mut decoder, &block, 100);
    assert_eq!(result, Err(DecodeError::ListTooLarge));
    assert_eq!(got, fields(&[(":method", "GET"), (":path", "/")]));
    // Exactly at the limit is within it.
    let (got, result) = decode(&mut decoder, &hex("82 84"), 42 + 38);
    assert_eq!((got.len(), result), (2, Ok(())));
    let (_, result) = decode(&mut decoder, &hex("82 84"), 42 + 38 - 1);
    assert_eq!(result, Err(DecodeError::ListTooLarge));
    let (got, result) = decode(&mut decoder, &[], 0);
    assert_eq!((got.len(), result), (0, Ok(())));
}

#[test]
fn encoder_emits_size_updates() {
    let mut encoder = Encoder::new();
    let mut decoder = Decoder::new(4096);
    let block = |encoder: &mut Encoder| {
        let mut dst = BytesMut::new();
        encoder.begin_block(&mut dst);
        dst.to_vec()
    };
    // Nothing pending: nothing written.
    assert_eq!(block(&mut encoder), []);
    // The same size, or a larger setting than we keep: nothing.
    encoder.set_max_table_size(4096);
    assert_eq!(block(&mut encoder), []);
    encoder.set_max_table_size(65_536);
    assert_eq!(block(&mut encoder), []);
    // Down: one update, once.
    encoder.set_max_table_size(100);
    assert_eq!(block(&mut encoder), hex("3f 45"));
    assert_eq!(block(&mut encoder), []);
    // Down and back up between blocks: the smallest, then the final (RFC 7541 §4.2).
    encoder.set_max_table_size(0);
    encoder.set_max_table_size(4096);
    assert_eq!(block(&mut encoder), hex("20 3f e1 1f"));
    // Up, then down below the start: just the final (which is the smallest).
    encoder.set_max_table_size(4096);
    encoder.set_max_table_size(200);
    encoder.set_max_table_size(50);
    assert_eq!(block(&mut encoder), hex("3f 13"));

    // The decoder follows: entries added before are evicted by the update.
    let mut encoder = Encoder::new();
    let mut dst = BytesMut::new();
    encoder.begin_block(&mut dst);
    encoder.encode(b"k1", b"v1", Indexing::Incremental, &mut dst);
    encoder.encode(b"k2", b"v2", Indexing::Incremental, &mut dst);
    let _ = decode(&mut decoder, &dst, usize::MAX);
    assert_eq!(decoder.table.len(), 2);
    encoder.set_max_table_size(40);
    dst.clear();
    encoder.begin_block(&mut dst);
    encoder.encode(b"k1", b"v1", Indexing::Incremental, &mut dst);
    let (got, result) = decode(&mut decoder, &dst, usize::MAX);
    assert_eq!((got, result), (fields(&[("k1", "v1")]), Ok(())));
    assert_eq!(table_of(&decoder), fields(&[("k1", "v1")]));
    assert_same_tables(&encoder, &decoder);
}

#[test]
fn decoder_size_updates() {
    let mut decoder = Decoder::new(256);
    // Above our setting.
    let (_, result) = decode(&mut decoder, &hex("3f e2 01"), usize::MAX);
    assert_eq!(result, Err(DecodeError::SizeUpdateTooLarge));
    // At it, then a field that fits; then down to 0 evicts it.
    let mut decoder = Decoder::new(256);
    let (_, result) = decode(&mut decoder, &hex("3f e1 01 40 0161 0162"), usize::MAX);
    assert_eq!(result, Ok(()));
    assert_eq!(decoder.table.len(), 1);
    let (_, result) = decode(&mut decoder, &hex("20 82"), usize::MAX);
    assert_eq!(result, Ok(()));
    assert_eq!(decoder.table.len(), 0);
    // In the middle of a block.
    let (_, result) = decode(&mut decoder, &hex("82 3f e1 01"), usize::MAX);
    assert_eq!(result, Err(DecodeError::SizeUpdateNotAtStart));
    // Our setting lowered: the table is cut now, and the peer may not go back up.
    let mut decoder = Decoder::new(4096);
    let _ = decode(&mut decoder, &hex(C3[0].block), usize::MAX);
    let _ = decode(&mut decoder, &hex(C3[1].block), usize::MAX);
    assert_eq!(decoder.table.size(), 110);
    decoder.set_max_table_size(60);
    assert_eq!(table_of(&decoder), fields(&[("cache-control", "no-cache")]));
    let (_, result) = decode(&mut decoder, &hex("3f 1e"), usize::MAX);
    assert_eq!(result, Err(DecodeError::SizeUpdateTooLarge));
    // Raised: the table keeps its size until the peer's update.
    decoder.set_max_table_size(4096);
    assert_eq!(decoder.table.max_size(), 60);
    let (_, result) = decode(&mut decoder, &hex("3f e1 1f"), usize::MAX);
    assert_eq!(result, Ok(()));
    assert_eq!(decoder.table.max_size(), 4096);
}

#[test]
fn zero_copy_strings() {
    // A plain value is a slice of the block; a static name is static; a dynamic
    // entry is a copy of its own (not holding the block).
    let block = Bytes::from(hex("04 0c 2f73 616d 706c 652f 7061 7468 40 0161 0162"));
    let mut decoder = Decoder::new(4096);
    let mut got = Vec::new();
    decoder
        .decode(&block, usize::MAX, |n, v| got.push((n, v)))
        .unwrap();
    let range = block.as_ptr_range();
    assert!(range.contains(&got[0].1.as_ptr()));
    assert!(!range.contains(&got[0].0.as_ptr()));
    assert!(!range.contains(&got[1].1.as_ptr()));
    let (name, value) = decoder.table.get(0).unwrap();
    assert!(!range.contains(&name.as_ptr()) && !range.contains(&value.as_ptr()));
    // An indexed dynamic entry is the table's bytes, shared.
    let mut again = Vec::new();
    decoder
        .decode(&Bytes::from_static(&[0xbe]), usize::MAX, |n, v| {
            again.push((n, v))
        })
        .unwrap();
    assert_eq!(
        again[0].1.as_ptr(),
        decoder.table.get(0).unwrap().1.as_ptr()
    );
}

/// A small deterministic PRNG (xorshift64*).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    fn bytes(&mut self, len: usize) -> Vec<u8> {
        (0..len).map(|_| self.next() as u8).collect()
    }

    /// Fewer than `max` random bytes.
    fn some_bytes(&mut self, max: usize) -> Vec<u8> {
        let len = self.below(max);
        self.bytes(len)
    }
}

/// A random field: names and values from small pools (so they repeat and hit the
/// tables), sometimes random or large.
fn random_field(rng: &mut Rng) -> (Vec<u8>, Vec<u8>) {
    const NAMES: [&[u8]; 8] = [
        b":method",
        b":path",
        b":status",
        b"content-type",
        b"grpc-status",
        b"x-request-id",
        b"set-cookie",
        b"",
    ];
    const VALUES: [&[u8]; 7] = [
        b"GET",
        b"/",
        b"200",
        b"application/grpc",
        b"0",
        b"",
        b"gzip, deflate",
    ];
    let name = match rng.below(4) {
        0 => rng.some_bytes(20),
        _ => NAMES[rng.below(NAMES.len())].to_vec(),
    };
    let value = match rng.below(8) {
        0 => rng.some_bytes(200),
        1 if rng.below(4) == 0 => rng.bytes(5000),
        2 | 3 => rng.some_bytes(8),
        _ => VALUES[rng.below(VALUES.len())].to_vec(),
    };
    (name, value)
}

#[test]
fn random_lists_round_trip() {
    const SETTINGS: [u32; 9] = [0, 1, 32, 50, 100, 256, 4096, 8192, u32::MAX];
    let mut rng = Rng(0x5eed_1234_abcd_ef01);
    for round in 0..200 {
        let mut encoder = Encoder::new();
        let mut decoder = Decoder::new(4096);
        for block_no in 0..20 {
            // Sometimes the peer's setting changes between blocks, maybe twice.
            for _ in 0..rng.below(4).saturating_sub(1) {
                encoder.set_max_table_size(SETTINGS[rng.below(SETTINGS.len())]);
            }
            let list: Vec<(Vec<u8>, Vec<u8>)> =
                (0..rng.below(12)).map(|_| random_field(&mut rng)).collect();
            let mut block = BytesMut::new();
            encoder.begin_block(&mut block);
            for (name, value) in &list {
                let indexing = [
                    Indexing::Incremental,
                    Indexing::Incremental,
                    Indexing::No,
                    Indexing::Never,
                ][rng.below(4)];
                encoder.encode(name, value, indexing, &mut block);
            }
            let mut got = Vec::new();
            let result = decoder.decode(&block.freeze(), usize::MAX, |n, v| {
                got.push((n.to_vec(), v.to_vec()))
            });
            assert_eq!(result, Ok(()), "round {round} block {block_no}");
            assert_eq!(got, list, "round {round} block {block_no}");
            assert_same_tables(&encoder, &decoder);
            assert!(decoder.table.size() <= decoder.table.max_size());
        }
    }
}

#[test]
fn random_bytes_never_panic() {
    // Valid blocks with bytes flipped, cut or spliced, and plain noise: decoding
    // never panics, and handed-out fields stay within the limit.
    let mut rng = Rng(99);
    let valid: Vec<Vec<u8>> = [&C3, &C4, &C5, &C6]
        .iter()
        .flat_map(|steps| steps.iter().map(|s| hex(s.block)))
        .collect();
    for _ in 0..20_000 {
        let mut block = match rng.below(3) {
            0 => rng.some_bytes(64),
            _ => valid[rng.below(valid.len())].clone(),
        };
        for _ in 0..rng.below(4) {
            if block.is_empty() {
                break;
            }
            let at = rng.below(block.len());
            match rng.below(3) {
                0 => block[at] = rng.next() as u8,
                1 => block.truncate(at),
                _ => block.insert(at, rng.next() as u8),
            }
        }
        let limit = rng.below(400);
        let mut decoder = Decoder::new(rng.below(300));
        let mut size = 0;
        let _ = decoder.decode(&Bytes::from(block), limit, |n, v| {
            size += field_size(n.len(), v.len())
        });
        assert!(size <= limit);
        assert!(decoder.table.size() <= decoder.table.max_size());
    }
}

#[test]
fn the_fuzz_entry_point_runs() {
    // The fuzz target's checks, over its seeds' shape and noise.
    let mut rng = Rng(3);
    for steps in [&C3, &C4, &C5, &C6] {
        let mut data = vec![8, 255];
        for step in steps.iter() {
            let block = hex(step.block);
            data.push(block.len() as u8);
            data.extend_from_slice(&block);
        }
        crate::fuzzing::hpack(&data);
        data[1] = 4;
        crate::fuzzing::hpack(&data);
    }
    for _ in 0..2000 {
        let len = rng.below(300);
        crate::fuzzing::hpack(&rng.bytes(len));
    }
}
