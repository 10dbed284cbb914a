package cdc

import (
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"time"
)

// Strict parsers for the outbox columns' values as pgoutput sends them:
// text format as the walsender prints it (DateStyle ISO, bytea_output hex,
// both set on the replication connection), or binary format (the types'
// send functions). They allocate nothing but their errors, and keep no
// reference to their input: the caller copies what it keeps.
//
// errUnusual means a value is well formed for PostgreSQL but not in the
// one shape the server emits for the outbox (a year past 9999, more than
// six fraction digits, an escape-format bytea, ...). The caller then
// decodes the message through pgtype instead.
var errUnusual = errors.New("cdc: value not in the form the fast decoder reads")

// parseInt8Text parses an int8 in text format.
func parseInt8Text(b []byte) (int64, error) {
	// strconv with a converted string that does not escape costs no
	// allocation.
	n, err := strconv.ParseInt(string(b), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("invalid int8 %q", b)
	}
	return n, nil
}

// parseInt8Binary parses an int8 in binary format: 8 bytes, big-endian.
func parseInt8Binary(b []byte) (int64, error) {
	if len(b) != 8 {
		return 0, fmt.Errorf("binary int8 of %d bytes, want 8", len(b))
	}
	return int64(binary.BigEndian.Uint64(b)), nil
}

// uuidTextLen is the length of a uuid's canonical text form,
// xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx.
const uuidTextLen = 36

// appendUUIDText checks that b is a uuid in canonical text form (the only
// form uuid_out prints) and appends it to dst in lower case.
func appendUUIDText(dst, b []byte) ([]byte, error) {
	if len(b) != uuidTextLen {
		return dst, fmt.Errorf("invalid uuid %q: want 36 characters", b)
	}
	for i, c := range b {
		switch i {
		case 8, 13, 18, 23:
			if c != '-' {
				return dst, fmt.Errorf("invalid uuid %q: want a dash at offset %d", b, i)
			}
			dst = append(dst, c)
			continue
		}
		switch {
		case '0' <= c && c <= '9', 'a' <= c && c <= 'f':
		case 'A' <= c && c <= 'F':
			c += 'a' - 'A'
		default:
			return dst, fmt.Errorf("invalid uuid %q: %q is not a hex digit", b, c)
		}
		dst = append(dst, c)
	}
	return dst, nil
}

// appendUUIDBinary appends the canonical text form of a binary uuid (16
// bytes) to dst.
func appendUUIDBinary(dst, b []byte) ([]byte, error) {
	if len(b) != 16 {
		return dst, fmt.Errorf("binary uuid of %d bytes, want 16", len(b))
	}
	const digits = "0123456789abcdef"
	for i, c := range b {
		switch i {
		case 4, 6, 8, 10:
			dst = append(dst, '-')
		}
		dst = append(dst, digits[c>>4], digits[c&0xf])
	}
	return dst, nil
}

// hexByteaLen returns the decoded length of a bytea in text format:
// "\x" followed by an even number of hex digits. Anything without the
// "\x" prefix (the escape format) is errUnusual.
func hexByteaLen(b []byte) (int, error) {
	if len(b) < 2 || b[0] != '\\' || b[1] != 'x' {
		return 0, errUnusual
	}
	if len(b)%2 != 0 {
		return 0, fmt.Errorf("invalid hex bytea: odd number of hex digits (%d)", len(b)-2)
	}
	return (len(b) - 2) / 2, nil
}

// appendHexBytea decodes a bytea in text format that hexByteaLen
// accepted, appending the bytes to dst.
func appendHexBytea(dst, b []byte) ([]byte, error) {
	n := len(dst)
	dst = slices.Grow(dst, (len(b)-2)/2)[:n+(len(b)-2)/2]
	if _, err := hex.Decode(dst[n:], b[2:]); err != nil {
		return dst[:n], fmt.Errorf("invalid hex bytea: %w", err)
	}
	return dst, nil
}

// jsonbBinaryVersion is the version byte that starts a binary jsonb.
const jsonbBinaryVersion = 1

// Timestamps PostgreSQL can hold but the relay refuses: an event's
// creation time is never infinite nor before the common era, and Kafka
// timestamps are milliseconds since 1970 anyway.
var (
	errInfinity = errors.New("infinite timestamps are not supported")
	errBC       = errors.New("timestamps before year 1 (BC) are not supported")
)

// parseTimestamptzText parses a timestamptz in the text form the server
// prints under DateStyle ISO: "2006-01-02 15:04:05[.ffffff]+hh[:mm[:ss]]",
// the offset being the session time zone's. It returns the instant in
// time.Local, as pgtype does, so either decoder gives the same value.
// "infinity", "-infinity" and " BC" dates are errors; a year past 9999,
// more than six fraction digits, or an offset of more than two hour digits
// are errUnusual.
func parseTimestamptzText(b []byte) (time.Time, error) {
	switch string(b) {
	case "infinity", "-infinity":
		return time.Time{}, errInfinity
	}
	if len(b) > 3 && string(b[len(b)-3:]) == " BC" {
		return time.Time{}, errBC
	}
	// The fixed part, "2006-01-02 15:04:05", and at least one more byte.
	if len(b) < 20 {
		return time.Time{}, badTimestamp(b)
	}
	if isDigit(b[4]) {
		return time.Time{}, errUnusual // a year of five digits or more
	}
	year, ok1 := digits(b[0:4])
	month, ok2 := digits(b[5:7])
	day, ok3 := digits(b[8:10])
	hour, ok4 := digits(b[11:13])
	minute, ok5 := digits(b[14:16])
	sec, ok6 := digits(b[17:19])
	if !ok1 || !ok2 || !ok3 || !ok4 || !ok5 || !ok6 ||
		b[4] != '-' || b[7] != '-' || b[10] != ' ' || b[13] != ':' || b[16] != ':' {
		return time.Time{}, badTimestamp(b)
	}
	if year < 1 || month < 1 || month > 12 || day < 1 || day > daysIn(year, month) ||
		hour > 23 || minute > 59 || sec > 59 {
		return time.Time{}, badTimestamp(b)
	}
	i := 19
	nsec := 0
	if b[i] == '.' {
		i++
		start := i
		for i < len(b) && isDigit(b[i]) {
			nsec = nsec*10 + int(b[i]-'0')
			i++
		}
		switch n := i - start; {
		case n == 0:
			return time.Time{}, badTimestamp(b)
		case n > 6:
			return time.Time{}, errUnusual // pgtype rounds as the server would
		default:
			for ; n < 9; n++ {
				nsec *= 10
			}
		}
	}
	offset, err := parseOffset(b, i)
	if err != nil {
		return time.Time{}, err
	}
	unix := time.Date(year, time.Month(month), day, hour, minute, sec, 0, time.UTC).Unix() - int64(offset)
	return time.Unix(unix, int64(nsec)), nil
}

// parseOffset parses the "+hh[:mm[:ss]]" that ends b at i, in seconds
// east of UTC.
func parseOffset(b []byte, i int) (int, error) {
	rest := b[i:]
	if len(rest) == 0 {
		return 0, badTimestamp(b) // no offset: not a timestamptz
	}
	var sign int
	switch rest[0] {
	case '+':
		sign = 1
	case '-':
		sign = -1
	case 'Z':
		return 0, errUnusual
	default:
		return 0, badTimestamp(b)
	}
	rest = rest[1:]
	if len(rest) > 2 && isDigit(rest[2]) {
		return 0, errUnusual // more than two hour digits
	}
	var parts [3]int
	for n := 0; n < 3; n++ {
		if len(rest) < 2 {
			return 0, badTimestamp(b)
		}
		v, ok := digits(rest[:2])
		if !ok || (n > 0 && v > 59) {
			return 0, badTimestamp(b)
		}
		parts[n] = v
		rest = rest[2:]
		if len(rest) == 0 {
			return sign * (parts[0]*3600 + parts[1]*60 + parts[2]), nil
		}
		if rest[0] != ':' || n == 2 {
			return 0, badTimestamp(b)
		}
		rest = rest[1:]
	}
	return 0, badTimestamp(b)
}

func badTimestamp(b []byte) error {
	return fmt.Errorf("invalid timestamptz %q", b)
}

// Binary timestamptz: microseconds since 2000-01-01 00:00:00 UTC, with
// the extremes of int64 meaning infinity and -infinity.
const postgresEpochUnix = 946_684_800

var (
	year1Unix       = time.Date(1, 1, 1, 0, 0, 0, 0, time.UTC).Unix()
	endTimestampUTC = time.Date(294277, 1, 1, 0, 0, 0, 0, time.UTC).Unix()
)

// parseTimestamptzBinary parses a timestamptz in binary format.
func parseTimestamptzBinary(b []byte) (time.Time, error) {
	if len(b) != 8 {
		return time.Time{}, fmt.Errorf("binary timestamptz of %d bytes, want 8", len(b))
	}
	usec := int64(binary.BigEndian.Uint64(b))
	if usec == math.MaxInt64 || usec == math.MinInt64 {
		return time.Time{}, errInfinity
	}
	sec, frac := usec/1_000_000, usec%1_000_000
	if frac < 0 {
		sec, frac = sec-1, frac+1_000_000
	}
	unix := sec + postgresEpochUnix
	if unix < year1Unix {
		return time.Time{}, errBC
	}
	if unix >= endTimestampUTC {
		return time.Time{}, fmt.Errorf("timestamptz %d microseconds from 2000-01-01 is out of range", usec)
	}
	return time.Unix(unix, frac*1000), nil
}

func isDigit(c byte) bool { return '0' <= c && c <= '9' }

// digits parses a short run of decimal digits.
func digits(b []byte) (int, bool) {
	n := 0
	for _, c := range b {
		if !isDigit(c) {
			return 0, false
		}
		n = n*10 + int(c-'0')
	}
	return n, true
}

func daysIn(year, month int) int {
	switch month {
	case 2:
		if year%4 == 0 && (year%100 != 0 || year%400 == 0) {
			return 29
		}
		return 28
	case 4, 6, 9, 11:
		return 30
	}
	return 31
}
