package cdc

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgtype"
)

func TestParseInt8Text(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want int64
		err  bool
	}{
		{in: "0", want: 0},
		{in: "42", want: 42},
		{in: "-7", want: -7},
		{in: "9223372036854775807", want: math.MaxInt64},
		{in: "-9223372036854775808", want: math.MinInt64},
		{in: "9223372036854775808", err: true},
		{in: "", err: true},
		{in: "12a", err: true},
		{in: " 1", err: true},
		{in: "1.5", err: true},
		{in: "1_000", err: true},
	} {
		got, err := parseInt8Text([]byte(tc.in))
		if (err != nil) != tc.err || got != tc.want {
			t.Errorf("parseInt8Text(%q) = %d, %v", tc.in, got, err)
		}
	}
}

func TestParseInt8Binary(t *testing.T) {
	got, err := parseInt8Binary([]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xfe})
	if err != nil || got != -2 {
		t.Errorf("parseInt8Binary(-2) = %d, %v", got, err)
	}
	for _, n := range []int{0, 4, 7, 9} {
		if _, err := parseInt8Binary(make([]byte, n)); err == nil {
			t.Errorf("parseInt8Binary accepted %d bytes", n)
		}
	}
}

func TestUUIDText(t *testing.T) {
	for _, tc := range []struct{ in, want, err string }{
		{in: "12345678-9abc-def0-0102-030405060708", want: "12345678-9abc-def0-0102-030405060708"},
		{in: "00000000-0000-0000-0000-000000000000", want: "00000000-0000-0000-0000-000000000000"},
		{in: "A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11", want: "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"},
		{in: "", err: "want 36 characters"},
		{in: "a0eebc999c0b4ef8bb6d6bb9bd380a11", err: "want 36 characters"},
		{in: "{a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a1}", err: "want 36 characters"},
		{in: "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a1", err: "want 36 characters"},
		{in: "a0eebc99x9c0b-4ef8-bb6d-6bb9bd380a11", err: "dash at offset 8"},
		{in: "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a1g", err: "not a hex digit"},
		{in: "a0eebc99-9c0b-4ef8-bb6d-6bb9bd38-a11", err: "not a hex digit"},
	} {
		got, err := appendUUIDText([]byte("prefix:"), []byte(tc.in))
		switch {
		case tc.err != "":
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("appendUUIDText(%q) error = %v, want %q", tc.in, err, tc.err)
			}
		case err != nil || string(got) != "prefix:"+tc.want:
			t.Errorf("appendUUIDText(%q) = %q, %v", tc.in, got, err)
		}
	}
}

func TestUUIDBinary(t *testing.T) {
	in := []byte{0xa0, 0xee, 0xbc, 0x99, 0x9c, 0x0b, 0x4e, 0xf8, 0xbb, 0x6d, 0x6b, 0xb9, 0xbd, 0x38, 0x0a, 0x11}
	got, err := appendUUIDBinary(nil, in)
	if err != nil || string(got) != "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11" {
		t.Errorf("appendUUIDBinary = %q, %v", got, err)
	}
	if want := (pgtype.UUID{Bytes: [16]byte(in), Valid: true}).String(); string(got) != want {
		t.Errorf("appendUUIDBinary = %q, pgtype says %q", got, want)
	}
	if _, err := appendUUIDBinary(nil, in[:15]); err == nil {
		t.Error("appendUUIDBinary accepted 15 bytes")
	}
}

func TestHexBytea(t *testing.T) {
	for _, tc := range []struct {
		in      string
		want    []byte
		err     string
		unusual bool
	}{
		{in: `\x`, want: []byte{}},
		{in: `\x00ff7f`, want: []byte{0, 0xff, 0x7f}},
		{in: `\xDEADbeef`, want: []byte{0xde, 0xad, 0xbe, 0xef}},
		{in: `abc`, unusual: true},      // escape format
		{in: `\001\002`, unusual: true}, // escape format
		{in: ``, unusual: true},         // escape format of ''
		{in: `\x0`, err: "odd number"},
		{in: `\x0g`, err: "invalid byte: U+0067 'g'"},
		{in: `\x00 1`, err: "invalid byte: U+0020 ' '"},
	} {
		n, err := hexByteaLen([]byte(tc.in))
		var got []byte
		if err == nil {
			got, err = appendHexBytea(make([]byte, 0, n), []byte(tc.in))
			if err == nil && len(got) != n {
				t.Errorf("hexByteaLen(%q) = %d, decoded %d bytes", tc.in, n, len(got))
			}
		}
		switch {
		case tc.unusual:
			if !errors.Is(err, errUnusual) {
				t.Errorf("bytea %q: %v, want errUnusual", tc.in, err)
			}
		case tc.err != "":
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("bytea %q: error %v, want %q", tc.in, err, tc.err)
			}
		case err != nil || !bytes.Equal(got, tc.want):
			t.Errorf("bytea %q = %x, %v", tc.in, got, err)
		}
	}
}

func TestTimestamptzText(t *testing.T) {
	utc := func(y int, mo time.Month, d, h, mi, s, ns int) time.Time {
		return time.Date(y, mo, d, h, mi, s, ns, time.UTC)
	}
	for _, tc := range []struct {
		in      string
		want    time.Time
		err     string
		unusual bool
	}{
		{in: "2026-12-01 04:26:57.098123+00", want: utc(2026, 12, 1, 4, 26, 57, 98123000)},
		{in: "2026-12-01 04:26:57+00", want: utc(2026, 12, 1, 4, 26, 57, 0)},
		{in: "2026-12-01 04:26:57.1+00", want: utc(2026, 12, 1, 4, 26, 57, 100000000)},
		{in: "2026-12-01 10:00:00+05:30", want: utc(2026, 12, 1, 4, 30, 0, 0)},
		{in: "2026-12-01 00:00:00-03:30", want: utc(2026, 12, 1, 3, 30, 0, 0)},
		{in: "1880-01-01 00:00:00+00:53:28", want: utc(1879, 12, 31, 23, 6, 32, 0)},
		{in: "2024-02-29 23:59:59.999999-12", want: utc(2024, 3, 1, 11, 59, 59, 999999000)},
		{in: "0001-01-01 00:00:00+00", want: utc(1, 1, 1, 0, 0, 0, 0)},
		{in: "9999-12-31 23:59:59.999999+14", want: utc(9999, 12, 31, 9, 59, 59, 999999000)},
		{in: "infinity", err: "infinite"},
		{in: "-infinity", err: "infinite"},
		{in: "2026-12-01 04:26:57+00 BC", err: "BC"},
		{in: "0044-03-15 12:00:00+00:53:28 BC", err: "BC"},
		{in: "2026-12-01", err: "invalid"},
		{in: "2026-12-01 04:26:57", err: "invalid"},
		{in: "2026-12-01 04:26:57.+00", err: "invalid"},
		{in: "2026-13-01 04:26:57+00", err: "invalid"},
		{in: "2023-02-29 04:26:57+00", err: "invalid"},
		{in: "2026-04-31 04:26:57+00", err: "invalid"},
		{in: "2026-12-01 24:00:00+00", err: "invalid"},
		{in: "2026-12-01 04:60:00+00", err: "invalid"},
		{in: "2026-12-01 04:26:60+00", err: "invalid"},
		{in: "0000-12-01 04:26:57+00", err: "invalid"},
		{in: "2026-12-01T04:26:57+00", err: "invalid"},
		{in: "2026-12-01 04:26:57+0", err: "invalid"},
		{in: "2026-12-01 04:26:57+05:3", err: "invalid"},
		{in: "2026-12-01 04:26:57+05:60", err: "invalid"},
		{in: "2026-12-01 04:26:57+05:30:00:00", err: "invalid"},
		{in: "2026-12-01 04:26:57+05 ", err: "invalid"},
		{in: "2026-12-01 04:26:57 +05", err: "invalid"},
		{in: "2026-1a-01 04:26:57+00", err: "invalid"},
		{in: "10000-01-01 00:00:00+00", unusual: true},
		{in: "2026-12-01 04:26:57.0981234+00", unusual: true},
		{in: "2026-12-01 04:26:57Z", unusual: true},
		{in: "2026-12-01 04:26:57+100", unusual: true},
	} {
		got, err := parseTimestamptzText([]byte(tc.in))
		switch {
		case tc.unusual:
			if !errors.Is(err, errUnusual) {
				t.Errorf("%q: %v, %v; want errUnusual", tc.in, got, err)
			}
		case tc.err != "":
			if err == nil || errors.Is(err, errUnusual) || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%q: %v, %v; want an error with %q", tc.in, got, err, tc.err)
			}
		default:
			if err != nil || !got.Equal(tc.want) || got.Location() != time.Local {
				t.Errorf("%q = %v, %v; want %v in time.Local", tc.in, got, err, tc.want)
			}
			var ref time.Time
			if err := pgtype.NewMap().Scan(pgtype.TimestamptzOID, pgtype.TextFormatCode, []byte(tc.in), &ref); err != nil || ref != got {
				t.Errorf("%q: pgtype reads %v (%v), the fast parser %v", tc.in, ref, err, got)
			}
		}
	}
}

func TestTimestamptzBinary(t *testing.T) {
	enc := func(usec int64) []byte { return binary.BigEndian.AppendUint64(nil, uint64(usec)) }
	for _, tc := range []struct {
		usec int64
		want time.Time
		err  string
	}{
		{usec: 0, want: time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)},
		{usec: -1, want: time.Date(1999, 12, 31, 23, 59, 59, 999999000, time.UTC)},
		{usec: 849_414_417_098_123, want: time.Date(2026, 12, 1, 4, 26, 57, 98123000, time.UTC)},
		{usec: -63_082_281_600_000_000, want: time.Date(1, 1, 1, 0, 0, 0, 0, time.UTC)},
		{usec: -63_082_281_600_000_001, err: "BC"},
		{usec: math.MaxInt64, err: "infinite"},
		{usec: math.MinInt64, err: "infinite"},
		{usec: math.MaxInt64 - 1, err: "out of range"},
	} {
		got, err := parseTimestamptzBinary(enc(tc.usec))
		switch {
		case tc.err != "":
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%d: %v, %v; want an error with %q", tc.usec, got, err, tc.err)
			}
		case err != nil || !got.Equal(tc.want) || got.Location() != time.Local:
			t.Errorf("%d = %v, %v; want %v in time.Local", tc.usec, got, err, tc.want)
		default:
			var ref time.Time
			if err := pgtype.NewMap().Scan(pgtype.TimestamptzOID, pgtype.BinaryFormatCode, enc(tc.usec), &ref); err != nil || ref != got {
				t.Errorf("%d: pgtype reads %v (%v), the fast parser %v", tc.usec, ref, err, got)
			}
		}
	}
	if _, err := parseTimestamptzBinary(make([]byte, 7)); err == nil {
		t.Error("7 bytes accepted")
	}
}
