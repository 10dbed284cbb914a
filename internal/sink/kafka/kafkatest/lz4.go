package kafkatest

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sync"

	"github.com/pierrec/lz4/v4"
	"github.com/twmb/franz-go/pkg/kgo"
)

// Decompressor is the read-backs' decompressor (kgo.WithDecompressor, or
// kgo.ProcessFetchPartition's argument). It is kgo's own except for lz4,
// the Kafka sink's default codec, whose frames it opens itself and whose
// blocks it decodes with lz4.UncompressBlock into one buffer it keeps.
//
// Why: pierrec/lz4's frame reader takes a buffer of the frame's block size
// (4 MiB as kgo writes them) from a sync.Pool for every frame, and under
// the race detector sync.Pool drops what is put back at random, so nearly
// every record batch allocates and clears 4 MiB. A relay publishing at a
// low rate writes batches of one or two records: reading 4,000 of them
// back took 1m44s under -race (29 ms without), and a loaded CI run's
// read-backs ran out of time with nothing read.
func Decompressor() kgo.Decompressor {
	return &decompressor{fallback: kgo.DefaultDecompressor()}
}

type decompressor struct {
	fallback kgo.Decompressor

	mu      sync.Mutex
	scratch []byte
}

func (d *decompressor) Decompress(src []byte, codec kgo.CompressionCodecType) ([]byte, error) {
	if codec != kgo.CodecLz4 {
		return d.fallback.Decompress(src, codec)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.lz4Frame(src)
}

// lz4Frame decodes one LZ4 frame (the format of lz4's frame specification,
// which Kafka's v2 record batches use): the header, then blocks until the
// end mark, each compressed or stored, with optional checksums (not
// verified: the record batch's CRC covers the compressed bytes).
func (d *decompressor) lz4Frame(src []byte) ([]byte, error) {
	const magic = 0x184D2204
	if len(src) < 7 || binary.LittleEndian.Uint32(src) != magic {
		return nil, errors.New("kafkatest: not an lz4 frame")
	}
	flg, bd := src[4], src[5]
	if flg>>6 != 1 {
		return nil, fmt.Errorf("kafkatest: lz4 frame version %d", flg>>6)
	}
	independent, blockSum, contentSize, contentSum, dictID := flg&0x20 != 0, flg&0x10 != 0, flg&0x08 != 0, flg&0x04 != 0, flg&0x01 != 0
	maxBlock := 1 << (8 + 2*int((bd>>4)&0x7))
	if maxBlock < 64<<10 {
		return nil, fmt.Errorf("kafkatest: lz4 block size index %d", (bd>>4)&0x7)
	}
	at := 6
	if contentSize {
		at += 8
	}
	if dictID {
		at += 4
	}
	at++ // the header checksum
	if cap(d.scratch) < maxBlock {
		d.scratch = make([]byte, maxBlock)
	}
	var out []byte
	for {
		if len(src) < at+4 {
			return nil, errors.New("kafkatest: lz4 frame cut short")
		}
		size := binary.LittleEndian.Uint32(src[at:])
		at += 4
		if size == 0 {
			break
		}
		stored, n := size&0x80000000 != 0, int(size&0x7fffffff)
		if n > maxBlock || len(src) < at+n {
			return nil, errors.New("kafkatest: lz4 block cut short")
		}
		block := src[at : at+n]
		at += n
		if blockSum {
			at += 4
		}
		if stored {
			out = append(out, block...)
			continue
		}
		var dict []byte
		if !independent {
			dict = out[max(0, len(out)-64<<10):]
		}
		m, err := lz4.UncompressBlockWithDict(block, d.scratch[:maxBlock], dict)
		if err != nil {
			return nil, fmt.Errorf("kafkatest: lz4 block: %w", err)
		}
		out = append(out, d.scratch[:m]...)
	}
	if contentSum && len(src) < at+4 {
		return nil, errors.New("kafkatest: lz4 frame cut short")
	}
	return out, nil
}
