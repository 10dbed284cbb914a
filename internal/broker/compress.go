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

// decompress expands a batch body into a new slice, refusing output beyond
// limit bytes.
func decompress(c Compression, src []byte, limit int) ([]byte, error) {
	return decompressTo(nil, c, src, limit)
}

// decompressTo expands a batch body into dst's backing array when it is
// large enough (a fresh one otherwise), refusing output beyond limit bytes.
func decompressTo(dst []byte, c Compression, src []byte, limit int) ([]byte, error) {
	dst = dst[:0]
	switch c {
	case CompressionGzip:
		zr, _ := gzipReaders.Get().(*gzip.Reader)
		var err error
		if zr == nil {
			zr, err = gzip.NewReader(bytes.NewReader(src))
		} else {
			err = zr.Reset(bytes.NewReader(src))
		}
		if err != nil {
			return nil, corrupt(c, err)
		}
		out, err := readLimited(dst, c, zr, limit)
		gzipReaders.Put(zr)
		return out, err
	case CompressionSnappy:
		return decompressSnappy(dst, src, limit)
	case CompressionLZ4:
		zr, _ := lz4Readers.Get().(*lz4.Reader)
		if zr == nil {
			zr = lz4.NewReader(bytes.NewReader(src))
		} else {
			zr.Reset(bytes.NewReader(src))
		}
		out, err := readLimited(dst, c, zr, limit)
		lz4Readers.Put(zr)
		return out, err
	case CompressionZstd:
		dec, err := sharedZstdDecoder()
		if err != nil {
			return nil, corrupt(c, err)
		}
		out, err := dec.DecodeAll(src, dst)
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

var (
	gzipReaders sync.Pool // *gzip.Reader
	lz4Readers  sync.Pool // *lz4.Reader
	// bodyBuffers holds *[]byte scratch space for decompressing produced
	// batches during validation.
	bodyBuffers = sync.Pool{New: func() any { b := make([]byte, 0, 256<<10); return &b }}
)

// maxPooledBody keeps one huge batch from pinning its buffer in the pool.
const maxPooledBody = 4 << 20

func getBodyBuffer() *[]byte { return bodyBuffers.Get().(*[]byte) }

func putBodyBuffer(b *[]byte, used []byte) {
	if used == nil {
		used = *b
	}
	if cap(used) > maxPooledBody {
		return
	}
	*b = used[:0]
	bodyBuffers.Put(b)
}

// readLimited appends r's output to dst, failing beyond limit bytes.
func readLimited(dst []byte, c Compression, r io.Reader, limit int) ([]byte, error) {
	for {
		if len(dst) == cap(dst) {
			dst = append(dst, 0)[:len(dst)]
		}
		n, err := r.Read(dst[len(dst):min(cap(dst), limit+1)])
		dst = dst[:len(dst)+n]
		if len(dst) > limit {
			return nil, fmt.Errorf("%w: decompressed size over %d bytes", ErrCorruptBatch, limit)
		}
		if err == io.EOF {
			return dst, nil
		}
		if err != nil {
			return nil, corrupt(c, err)
		}
	}
}

// snappyBlock appends one decoded snappy block to dst.
func snappyBlock(dst, src []byte, limit int) ([]byte, error) {
	n, err := s2.DecodedLen(src)
	if err != nil {
		return nil, corrupt(CompressionSnappy, err)
	}
	if n > limit-len(dst) {
		return nil, fmt.Errorf("%w: decompressed size over %d bytes", ErrCorruptBatch, limit)
	}
	out, err := s2.Decode(dst[len(dst):], src)
	if err != nil {
		return nil, corrupt(CompressionSnappy, err)
	}
	if len(dst) == 0 {
		return out, nil
	}
	if cap(dst)-len(dst) >= len(out) {
		// Decoded in place, right after dst.
		return dst[:len(dst)+len(out)], nil
	}
	return append(dst, out...), nil
}

func decompressSnappy(dst, src []byte, limit int) ([]byte, error) {
	if !bytes.HasPrefix(src, xerialHeader) {
		return snappyBlock(dst, src, limit)
	}
	// xerial framing: 8-byte magic, 4-byte version, 4-byte min version, then
	// chunks of [int32 length][snappy block].
	if len(src) < 16 {
		return nil, corrupt(CompressionSnappy, io.ErrUnexpectedEOF)
	}
	src = src[16:]
	out := dst
	for len(src) > 0 {
		if len(src) < 4 {
			return nil, corrupt(CompressionSnappy, io.ErrUnexpectedEOF)
		}
		n := binary.BigEndian.Uint32(src)
		src = src[4:]
		if uint64(n) > uint64(len(src)) {
			return nil, corrupt(CompressionSnappy, io.ErrUnexpectedEOF)
		}
		var err error
		out, err = snappyBlock(out, src[:n], limit)
		if err != nil {
			return nil, err
		}
		src = src[n:]
	}
	return out, nil
}

// streamCompress compresses src through the stream writer that newWriter
// makes (gzip, lz4); name prefixes its errors.
func streamCompress(name string, src []byte, newWriter func(io.Writer) io.WriteCloser) ([]byte, error) {
	var buf bytes.Buffer
	zw := newWriter(&buf)
	if _, err := zw.Write(src); err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	if err := zw.Close(); err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	return buf.Bytes(), nil
}

func compress(c Compression, src []byte) ([]byte, error) {
	switch c {
	case CompressionGzip:
		return streamCompress("gzip", src, func(w io.Writer) io.WriteCloser { return gzip.NewWriter(w) })
	case CompressionSnappy:
		return s2.EncodeSnappy(nil, src), nil
	case CompressionLZ4:
		return streamCompress("lz4", src, func(w io.Writer) io.WriteCloser { return lz4.NewWriter(w) })
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
