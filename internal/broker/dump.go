package broker

import (
	"context"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"time"
	"unicode/utf8"
)

// DumpOptions select what Dump prints.
type DumpOptions struct {
	DataDir string
	// Topic limits the dump to one topic ("" for all).
	Topic string
	// Partition limits the dump to one partition (-1 for all).
	Partition int32
	// FromOffset skips records below it.
	FromOffset int64
	// Format is "text" (default) or "json" (one object per line).
	Format string
}

// Validate checks the options.
func (o DumpOptions) Validate() error {
	if o.DataDir == "" {
		return fmt.Errorf("%w: data dir is required", ErrInvalidConfig)
	}
	if o.Format != "" && o.Format != "text" && o.Format != "json" {
		return fmt.Errorf("%w: format %q (want text or json)", ErrInvalidConfig, o.Format)
	}
	if o.Topic != "" {
		return ValidateTopicName(o.Topic)
	}
	return nil
}

type dumpRecord struct {
	Topic        string            `json:"topic"`
	Partition    int32             `json:"partition"`
	Offset       int64             `json:"offset"`
	Timestamp    string            `json:"timestamp"`
	Key          *string           `json:"key"`
	Value        *string           `json:"value"`
	Encoding     string            `json:"encoding,omitempty"`
	Headers      map[string]string `json:"headers,omitempty"`
	ProducerID   int64             `json:"producer_id"`
	BaseSequence int32             `json:"base_sequence"`
	// Transactional marks a record of a transaction; Control, "commit"
	// or "abort", a transaction marker (whose key and value are the
	// marker's, not data).
	Transactional bool   `json:"transactional,omitempty"`
	Control       string `json:"control,omitempty"`
}

// Dump prints the records stored under DataDir. It only reads: it takes no
// lock, never truncates, and stops each partition at the last complete,
// CRC-valid batch, so it is safe while a broker is appending (whose last
// second of batches may still be in its memory, writeback.go).
func Dump(ctx context.Context, w io.Writer, opts DumpOptions) error {
	if err := opts.Validate(); err != nil {
		return err
	}
	root := filepath.Join(opts.DataDir, "topics")
	topics := []string{opts.Topic}
	if opts.Topic == "" {
		entries, err := os.ReadDir(root)
		if err != nil {
			return fmt.Errorf("broker: list topics in %s: %w", root, err)
		}
		topics = topics[:0]
		for _, e := range entries {
			if e.IsDir() {
				topics = append(topics, e.Name())
			}
		}
	}
	for _, t := range topics {
		entries, err := os.ReadDir(filepath.Join(root, t))
		if err != nil {
			return fmt.Errorf("%w: %s: %w", ErrUnknownTopicOrPartition, t, err)
		}
		var parts []int
		for _, e := range entries {
			if n, err := strconv.Atoi(e.Name()); err == nil && e.IsDir() {
				parts = append(parts, n)
			}
		}
		sort.Ints(parts)
		found := false
		for _, p := range parts {
			if opts.Partition >= 0 && int32(p) != opts.Partition {
				continue
			}
			found = true
			if err := dumpPartition(ctx, w, opts, t, int32(p)); err != nil {
				return err
			}
		}
		if !found && opts.Partition >= 0 {
			return fmt.Errorf("%w: %s/%d", ErrUnknownTopicOrPartition, t, opts.Partition)
		}
	}
	return nil
}

func dumpPartition(ctx context.Context, w io.Writer, opts DumpOptions, topicName string, part int32) error {
	dir := filepath.Join(opts.DataDir, "topics", topicName, strconv.Itoa(int(part)))
	bases, _, err := listSegmentBases(OSFS{}, dir, false)
	if err != nil {
		return fmt.Errorf("broker: list segments of %s/%d: %w", topicName, part, err)
	}
	lost, err := readLost(OSFS{}, dir)
	if err != nil {
		return err
	}
	enc := json.NewEncoder(w)
	for i, base := range bases {
		if i+1 < len(bases) && bases[i+1] <= opts.FromOffset {
			continue
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		f, err := os.Open(segmentName(dir, base, logSuffix))
		if err != nil {
			if errors.Is(err, os.ErrNotExist) {
				continue // removed by retention while we listed
			}
			return fmt.Errorf("broker: open segment: %w", err)
		}
		var skip []span
		for _, r := range lost {
			if r.Segment == base && r.Size > 0 {
				skip = append(skip, span{pos: r.Pos, size: r.Size})
			}
		}
		size, err := fileSize(f)
		if err == nil {
			var stop int64
			stop, err = scanBatchesSkip(f, 0, size, true, skip, func(h BatchHeader, _ int64, b []byte) error {
				if h.LastOffset() < opts.FromOffset {
					return nil
				}
				recs, err := decodeRecords(h, b, maxDecompressedSize)
				if err != nil {
					return err
				}
				for _, r := range recs {
					if r.Offset < opts.FromOffset {
						continue
					}
					if err := writeDumpRecord(w, enc, opts.Format, topicName, part, h, r); err != nil {
						return err
					}
				}
				return nil
			})
			if (errors.Is(err, ErrCorruptBatch) || errors.Is(err, ErrUnsupportedMagic)) && i == len(bases)-1 {
				// A batch being written right now, or a torn tail the
				// broker will cut on its next open: stop quietly,
				// unless good batches follow (damage, not a tail).
				n := batchSizeAt(f, stop)
				if _, good := goodBatchAt(f, stop+int64(n), size); n == 0 || !good {
					err = nil
				}
			}
			if err != nil {
				err = fmt.Errorf("damaged batch in segment %d at byte %d: %w", base, stop, err)
			}
		}
		_ = f.Close()
		if err != nil {
			return fmt.Errorf("broker: dump %s/%d: %w", topicName, part, err)
		}
	}
	var errs []error
	for _, r := range lost {
		if r.Last < 0 || r.Last >= opts.FromOffset {
			errs = append(errs, &lostError{topic: topicName, partition: part, first: r.First, last: r.Last, reason: r.Reason})
		}
	}
	return errors.Join(errs...)
}

// batchSizeAt is the size the batch header at pos claims, 0 when there is
// no parsable header.
func batchSizeAt(f File, pos int64) int {
	var hdr [BatchHeaderSize]byte
	if _, err := f.ReadAt(hdr[:], pos); err != nil {
		return 0
	}
	h, err := ParseBatchHeader(hdr[:])
	if err != nil {
		return 0
	}
	return h.Size()
}

func dumpBytes(b []byte, binary bool) *string {
	if b == nil {
		return nil
	}
	var s string
	if binary {
		s = base64.StdEncoding.EncodeToString(b)
	} else {
		s = string(b)
	}
	return &s
}

func writeDumpRecord(w io.Writer, enc *json.Encoder, format, topicName string, part int32, h BatchHeader, r Record) error {
	binaryData := !utf8.Valid(r.Key) || !utf8.Valid(r.Value)
	for _, hd := range r.Headers {
		binaryData = binaryData || !utf8.Valid(hd.Value)
	}
	d := dumpRecord{
		Topic: topicName, Partition: part, Offset: r.Offset,
		Timestamp: r.Timestamp.UTC().Format(time.RFC3339Nano),
		Key:       dumpBytes(r.Key, binaryData), Value: dumpBytes(r.Value, binaryData),
		ProducerID: h.ProducerID, BaseSequence: h.BaseSequence,
		Transactional: h.Transactional(),
	}
	if h.Control() {
		d.Control = "abort"
		if len(r.Key) >= 4 && binary.BigEndian.Uint16(r.Key[2:]) == controlCommit {
			d.Control = "commit"
		}
	}
	if binaryData {
		d.Encoding = "base64"
	}
	if len(r.Headers) > 0 {
		d.Headers = map[string]string{}
		for _, hd := range r.Headers {
			if v := dumpBytes(hd.Value, binaryData); v != nil {
				d.Headers[hd.Key] = *v
			} else {
				d.Headers[hd.Key] = ""
			}
		}
	}
	if format == "json" {
		if err := enc.Encode(d); err != nil {
			return fmt.Errorf("broker: write dump: %w", err)
		}
		return nil
	}
	str := func(p *string) string {
		if p == nil {
			return "null"
		}
		return strconv.Quote(*p)
	}
	if d.Control != "" {
		_, err := fmt.Fprintf(w, "%s/%d offset=%d timestamp=%s control=%s producer_id=%d\n", topicName, part, r.Offset, d.Timestamp, d.Control, h.ProducerID)
		if err != nil {
			return fmt.Errorf("broker: write dump: %w", err)
		}
		return nil
	}
	line := fmt.Sprintf("%s/%d offset=%d timestamp=%s key=%s value=%s", topicName, part, r.Offset, d.Timestamp, str(d.Key), str(d.Value))
	if d.Transactional {
		line += " transactional=true"
	}
	for _, hd := range r.Headers {
		line += fmt.Sprintf(" header[%s]=%s", strconv.Quote(hd.Key), str(dumpBytes(hd.Value, binaryData)))
	}
	if binaryData {
		line += " encoding=base64"
	}
	if _, err := io.WriteString(w, line+"\n"); err != nil {
		return fmt.Errorf("broker: write dump: %w", err)
	}
	return nil
}
