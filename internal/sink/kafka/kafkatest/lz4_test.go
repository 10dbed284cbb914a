package kafkatest

import (
	"bytes"
	"io"
	"math/rand/v2"
	"testing"

	"github.com/pierrec/lz4/v4"
	"github.com/twmb/franz-go/pkg/kgo"
)

// TestDecompressorMatchesKgo decodes lz4 frames as kgo writes them, and as
// pierrec/lz4 writes them with every frame option that changes the
// layout (block and content checksums, 64 KiB blocks, several blocks,
// stored incompressible blocks), and gets what kgo's own decompressor
// gets; the other codecs go through kgo's.
func TestDecompressorMatchesKgo(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	payload := func(n int, random bool) []byte {
		b := make([]byte, n)
		for i := range b {
			if random {
				b[i] = byte(rng.UintN(256))
			} else {
				b[i] = "outbox event "[i%13]
			}
		}
		return b
	}
	var inputs [][]byte
	for _, n := range []int{0, 1, 300, 70 << 10, 300 << 10} {
		inputs = append(inputs, payload(n, false), payload(n, true))
	}
	ours, theirs := Decompressor(), kgo.DefaultDecompressor()
	check := func(name string, frame []byte, want []byte, codec kgo.CompressionCodecType) {
		t.Helper()
		got, err := ours.Decompress(frame, codec)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		ref, err := theirs.Decompress(frame, codec)
		if err != nil {
			t.Fatalf("%s: kgo: %v", name, err)
		}
		if !bytes.Equal(got, want) || !bytes.Equal(got, ref) {
			t.Fatalf("%s: got %d bytes, want %d (kgo %d)", name, len(got), len(want), len(ref))
		}
	}
	for _, codec := range []kgo.CompressionCodec{kgo.Lz4Compression(), kgo.ZstdCompression(), kgo.SnappyCompression()} {
		c, err := kgo.DefaultCompressor(codec)
		if err != nil {
			t.Fatal(err)
		}
		for _, in := range inputs {
			frame, used := c.Compress(new(bytes.Buffer), in)
			if used == kgo.CodecNone {
				continue
			}
			check("kgo", frame, in, used)
		}
	}
	options := []struct {
		opts     []lz4.Option
		withSize bool // the frame header carries the content size
	}{
		{opts: []lz4.Option{lz4.BlockChecksumOption(true), lz4.ChecksumOption(true)}},
		{opts: []lz4.Option{lz4.BlockSizeOption(lz4.Block64Kb), lz4.ChecksumOption(false)}},
		{opts: []lz4.Option{lz4.BlockSizeOption(lz4.Block256Kb), lz4.BlockChecksumOption(true)}, withSize: true},
	}
	for _, o := range options {
		for _, in := range inputs {
			var buf bytes.Buffer
			w := lz4.NewWriter(&buf)
			opts := o.opts
			if o.withSize {
				opts = append(opts[:len(opts):len(opts)], lz4.SizeOption(uint64(len(in))))
			}
			if err := w.Apply(opts...); err != nil {
				t.Fatal(err)
			}
			if _, err := io.Copy(w, bytes.NewReader(in)); err != nil {
				t.Fatal(err)
			}
			if err := w.Close(); err != nil {
				t.Fatal(err)
			}
			check("pierrec", buf.Bytes(), in, kgo.CodecLz4)
		}
	}
	if _, err := ours.Decompress([]byte("not a frame at all"), kgo.CodecLz4); err == nil {
		t.Fatal("a malformed frame decoded without an error")
	}
}
