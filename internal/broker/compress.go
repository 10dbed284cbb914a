package broker

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"sync"

	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/s2"
	"github.com/klauspost/compress/zstd"
	"github.com/pierrec/lz4/v4"
)

// Compression is a Kafka record batch codec (attributes bits 0-2).
type Compression int8

// Codecs as numbered by the Kafka protocol.
const (
	CompressionNone   Compression = 0
	CompressionGzip   Compression = 1
	CompressionSnappy Compression = 2
	CompressionLZ4    Compression = 3
	CompressionZstd   Compression = 4
)

func (c Compression) String() string {
	switch c {
	case CompressionNone:
		return "none"
	case CompressionGzip:
		return "gzip"
	case CompressionSnappy:
		return "snappy"
	case CompressionLZ4:
		return "lz4"
	case CompressionZstd:
		return "zstd"
	default:
		return fmt.Sprintf("unknown(%d)", int8(c))
	}
}

// xerialHeader starts snappy data framed the way the Java client (via
// snappy-java) writes it; plain snappy blocks come from other clients.
var xerialHeader = []byte{0x82, 'S', 'N', 'A', 'P', 'P', 'Y', 0}

var (
	zstdDecOnce sync.Once
	zstdDec     *zstd.Decoder
	zstdDecErr  error
	zstdEncOnce sync.Once
	zstdEnc     *zstd.Encoder
	zstdEncErr  error
)

func sharedZstdDecoder() (*zstd.Decoder, error) {
	zstdDecOnce.Do(func() {
		zstdDec, zstdDecErr = zstd.NewReader(nil, zstd.WithDecoderConcurrency(0), zstd.WithDecoderMaxMemory(maxDecompressedSize))
	})
	return zstdDec, zstdDecErr
}

func sharedZstdEncoder() (*zstd.Encoder, error) {
	zstdEncOnce.Do(func() {
		zstdEnc, zstdEncErr = zstd.NewWriter(nil, zstd.WithEncoderConcurrency(1))
	})
	return zstdEnc, zstdEncErr
}

func corrupt(c Compression, err error) error {
	return fmt.Errorf("%w: %s decompression: %w", ErrCorruptBatch, c, err)
}

// decompress expands a batch body, refusing output beyond limit bytes.
func decompress(c Compression, src []byte, limit int) ([]byte, error) {
	switch c {
	case CompressionGzip:
		zr, err := gzip.NewReader(bytes.NewReader(src))
		if err != nil {
			return nil, corrupt(c, err)
		}
		return readLimited(c, zr, limit)
	case CompressionSnappy:
		return decompressSnappy(src, limit)
	case CompressionLZ4:
		return readLimited(c, lz4.NewReader(bytes.NewReader(src)), limit)
	case CompressionZstd:
		dec, err := sharedZstdDecoder()
		if err != nil {
			return nil, corrupt(c, err)
		}
		out, err := dec.DecodeAll(src, nil)
		if err != nil {
			return nil, corrupt(c, err)
		}
		if len(out) > limit {
			return nil, fmt.Errorf("%w: decompressed size over %d bytes", ErrCorruptBatch, limit)
		}
		return out, nil
	default:
		return nil, fmt.Errorf("%w: unknown compression codec %d", ErrCorruptBatch, int8(c))
	}
}

func readLimited(c Compression, r io.Reader, limit int) ([]byte, error) {
	out, err := io.ReadAll(io.LimitReader(r, int64(limit)+1))
	if err != nil {
		return nil, corrupt(c, err)
	}
	if len(out) > limit {
		return nil, fmt.Errorf("%w: decompressed size over %d bytes", ErrCorruptBatch, limit)
	}
	return out, nil
}

func snappyBlock(src []byte, limit int) ([]byte, error) {
	n, err := s2.DecodedLen(src)
	if err != nil {
		return nil, corrupt(CompressionSnappy, err)
	}
	if n > limit {
		return nil, fmt.Errorf("%w: decompressed size over %d bytes", ErrCorruptBatch, limit)
	}
	out, err := s2.Decode(nil, src)
	if err != nil {
		return nil, corrupt(CompressionSnappy, err)
	}
	return out, nil
}

func decompressSnappy(src []byte, limit int) ([]byte, error) {
	if !bytes.HasPrefix(src, xerialHeader) {
		return snappyBlock(src, limit)
	}
	// xerial framing: 8-byte magic, 4-byte version, 4-byte min version, then
	// chunks of [int32 length][snappy block].
	if len(src) < 16 {
		return nil, corrupt(CompressionSnappy, io.ErrUnexpectedEOF)
	}
	src = src[16:]
	var out []byte
	for len(src) > 0 {
		if len(src) < 4 {
			return nil, corrupt(CompressionSnappy, io.ErrUnexpectedEOF)
		}
		n := binary.BigEndian.Uint32(src)
		src = src[4:]
		if uint64(n) > uint64(len(src)) {
			return nil, corrupt(CompressionSnappy, io.ErrUnexpectedEOF)
		}
		chunk, err := snappyBlock(src[:n], limit-len(out))
		if err != nil {
			return nil, err
		}
		out = append(out, chunk...)
		src = src[n:]
	}
	return out, nil
}

func compress(c Compression, src []byte) ([]byte, error) {
	switch c {
	case CompressionGzip:
		var buf bytes.Buffer
		zw := gzip.NewWriter(&buf)
		if _, err := zw.Write(src); err != nil {
			return nil, fmt.Errorf("gzip: %w", err)
		}
		if err := zw.Close(); err != nil {
			return nil, fmt.Errorf("gzip: %w", err)
		}
		return buf.Bytes(), nil
	case CompressionSnappy:
		return s2.EncodeSnappy(nil, src), nil
	case CompressionLZ4:
		var buf bytes.Buffer
		zw := lz4.NewWriter(&buf)
		if _, err := zw.Write(src); err != nil {
			return nil, fmt.Errorf("lz4: %w", err)
		}
		if err := zw.Close(); err != nil {
			return nil, fmt.Errorf("lz4: %w", err)
		}
		return buf.Bytes(), nil
	case CompressionZstd:
		enc, err := sharedZstdEncoder()
		if err != nil {
			return nil, fmt.Errorf("zstd: %w", err)
		}
		return enc.EncodeAll(src, nil), nil
	default:
		return nil, fmt.Errorf("%w: unknown compression codec %d", ErrInvalidConfig, int8(c))
	}
}
