package protocol

import (
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"slices"
	"testing"
	"time"

	"github.com/outboxrelay/relay/internal/broker"
	"github.com/twmb/franz-go/pkg/kbin"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// rawConn speaks the protocol by hand, to send what real clients never do.
type rawConn struct {
	t    testing.TB
	c    net.Conn
	corr int32
}

func dialRaw(t testing.TB, addr string) *rawConn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return &rawConn{t: t, c: c}
}

// testClient formats requests as the client "test".
var testClient = kmsg.NewRequestFormatter(kmsg.FormatterClientID("test"))

func encodeRequest(corr int32, req kmsg.Request) []byte {
	return testClient.AppendRequest(nil, req, corr)
}

// latestOffsetTopic is the topic of a ListOffsets request that asks for
// the latest offset (timestamp -1) of topic's partition 0.
func latestOffsetTopic(topic string) kmsg.ListOffsetsRequestTopic {
	rt := kmsg.NewListOffsetsRequestTopic()
	rt.Topic = topic
	rp := kmsg.NewListOffsetsRequestTopicPartition()
	rp.Timestamp = -1
	rt.Partitions = append(rt.Partitions, rp)
	return rt
}

func (r *rawConn) send(req kmsg.Request) int32 {
	r.t.Helper()
	r.corr++
	r.writeRaw(encodeRequest(r.corr, req))
	return r.corr
}

func (r *rawConn) writeRaw(b []byte) {
	r.t.Helper()
	if _, err := r.c.Write(b); err != nil {
		r.t.Fatalf("write: %v", err)
	}
}

// recv reads one response frame into resp (whose version must be set) and
// returns its correlation id.
func (r *rawConn) recv(resp kmsg.Response) int32 {
	r.t.Helper()
	body, err := r.readFrame()
	if err != nil {
		r.t.Fatalf("read response: %v", err)
	}
	rd := kbin.Reader{Src: body}
	corr := rd.Int32()
	if resp.IsFlexible() && resp.Key() != kmsg.ApiVersions.Int16() {
		kmsg.SkipTags(&rd)
	}
	if err := resp.ReadFrom(rd.Src); err != nil {
		r.t.Fatalf("decode %T: %v", resp, err)
	}
	return corr
}

func (r *rawConn) readFrame() ([]byte, error) {
	_ = r.c.SetReadDeadline(time.Now().Add(10 * time.Second))
	var size [4]byte
	if _, err := io.ReadFull(r.c, size[:]); err != nil {
		return nil, err
	}
	body := make([]byte, binary.BigEndian.Uint32(size[:]))
	_, err := io.ReadFull(r.c, body)
	return body, err
}

// expectClosed asserts that the server closed the connection.
func (r *rawConn) expectClosed() {
	r.t.Helper()
	if _, err := r.readFrame(); !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) && !isReset(err) {
		r.t.Fatalf("connection still open (read err %v)", err)
	}
}

func isReset(err error) bool {
	var ne *net.OpError
	return errors.As(err, &ne) && !ne.Timeout()
}

func metadataWorks(t *testing.T, addr string) {
	t.Helper()
	rc := dialRaw(t, addr)
	req := kmsg.NewPtrMetadataRequest()
	req.Version = 9
	corr := rc.send(req)
	resp := req.ResponseKind().(*kmsg.MetadataResponse)
	if got := rc.recv(resp); got != corr || len(resp.Brokers) != 1 {
		t.Fatalf("metadata: corr %d want %d, brokers %+v", got, corr, resp.Brokers)
	}
}

func TestApiVersionsUnsupportedVersionAnswersV0(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	rc := dialRaw(t, f.addr)
	req := kmsg.NewPtrApiVersionsRequest()
	req.Version = 5 // above our 3; the client expects a v0 answer.
	req.ClientSoftwareName, req.ClientSoftwareVersion = "test", "1"
	corr := rc.send(req)
	resp := kmsg.NewPtrApiVersionsResponse()
	resp.Version = 0
	if got := rc.recv(resp); got != corr {
		t.Fatalf("correlation id %d, want %d", got, corr)
	}
	if resp.ErrorCode != kerr.UnsupportedVersion.Code {
		t.Fatalf("error code %d, want UNSUPPORTED_VERSION", resp.ErrorCode)
	}
	keys := map[int16]kmsg.ApiVersionsResponseApiKey{}
	for _, k := range resp.ApiKeys {
		keys[k.ApiKey] = k
	}
	if k := keys[kmsg.ApiVersions.Int16()]; k.MaxVersion != 3 {
		t.Fatalf("ApiVersions range %+v", k)
	}
	if _, ok := keys[kmsg.OffsetForLeaderEpoch.Int16()]; ok {
		t.Fatal("OffsetForLeaderEpoch is advertised")
	}

	// The retry at v3 works on the same connection.
	req.Version = 3
	corr = rc.send(req)
	resp = kmsg.NewPtrApiVersionsResponse()
	resp.Version = 3
	if got := rc.recv(resp); got != corr || resp.ErrorCode != 0 || len(resp.ApiKeys) != len(supportedVersions) {
		t.Fatalf("v3: corr %d err %d keys %d", got, resp.ErrorCode, len(resp.ApiKeys))
	}
}

func TestBadInputClosesOnlyThatConnection(t *testing.T) {
	t.Parallel()
	f := setup(t, func(c *Config) { c.MaxFrameBytes = 1 << 20 })
	frames := map[string][]byte{
		"frame over the limit": binary.BigEndian.AppendUint32(nil, 1<<20+1),
		"negative size":        {0xff, 0xff, 0xff, 0xf0},
		"short header":         {0, 0, 0, 2, 0, 3},
		"unknown api key":      encodeUnknown(9999, 0),
		"unsupported version":  encodeUnknown(kmsg.Fetch.Int16(), 1),
		"truncated body": func() []byte {
			req := kmsg.NewPtrMetadataRequest()
			req.Version = 4
			topic := "t"
			req.Topics = []kmsg.MetadataRequestTopic{{Topic: &topic}}
			b := encodeRequest(1, req)
			b = b[:len(b)-3]
			binary.BigEndian.PutUint32(b, uint32(len(b)-4))
			return b
		}(),
	}
	for name, frame := range frames {
		t.Run(name, func(t *testing.T) {
			rc := dialRaw(t, f.addr)
			rc.writeRaw(frame)
			rc.expectClosed()
			metadataWorks(t, f.addr)
		})
	}
}

func encodeUnknown(key, version int16) []byte {
	b := []byte{0, 0, 0, 0}
	b = binary.BigEndian.AppendUint16(b, uint16(key))
	b = binary.BigEndian.AppendUint16(b, uint16(version))
	b = binary.BigEndian.AppendUint32(b, 7)
	b = binary.BigEndian.AppendUint16(b, 0xffff)
	b = append(b, 1, 2, 3)
	binary.BigEndian.PutUint32(b, uint32(len(b)-4))
	return b
}

func TestAcksZeroAndPipelinedOrder(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	f.createTopic(t, "acks", 1)
	rc := dialRaw(t, f.addr)

	produce := kmsg.NewPtrProduceRequest()
	produce.Version, produce.Acks, produce.TimeoutMillis = 7, 0, 5000
	rt := kmsg.NewProduceRequestTopic()
	rt.Topic = "acks"
	rp := kmsg.NewProduceRequestTopicPartition()
	rp.Records = broker.EncodeBatch(-1, -1, -1, []broker.Record{{Key: []byte("k"), Value: []byte("v")}})
	rt.Partitions = append(rt.Partitions, rp)
	produce.Topics = append(produce.Topics, rt)

	// Pipeline: acks=0 produce (no answer), then three metadata requests.
	var frames []byte
	frames = append(frames, encodeRequest(1, produce)...)
	md := kmsg.NewPtrMetadataRequest()
	md.Version = 1
	for corr := int32(2); corr <= 4; corr++ {
		frames = append(frames, encodeRequest(corr, md)...)
	}
	rc.writeRaw(frames)
	for want := int32(2); want <= 4; want++ {
		resp := md.ResponseKind()
		if got := rc.recv(resp); got != want {
			t.Fatalf("response correlation %d, want %d", got, want)
		}
	}
	if _, hw, _ := f.b.Offsets("acks", 0); hw != 1 {
		t.Fatalf("high watermark %d after acks=0 produce, want 1", hw)
	}

	// acks=1 is answered, with the offset.
	produce.Acks = 1
	produce.Topics[0].Partitions[0].Records = broker.EncodeBatch(-1, -1, -1, []broker.Record{{Value: []byte("w")}})
	corr := rc.send(produce)
	presp := produce.ResponseKind().(*kmsg.ProduceResponse)
	if got := rc.recv(presp); got != corr {
		t.Fatalf("corr %d want %d", got, corr)
	}
	if p := presp.Topics[0].Partitions[0]; p.ErrorCode != 0 || p.BaseOffset != 1 {
		t.Fatalf("produce answer %+v", p)
	}

	// Invalid acks are refused per partition.
	produce.Acks = 2
	rc.send(produce)
	presp = produce.ResponseKind().(*kmsg.ProduceResponse)
	rc.recv(presp)
	if code := presp.Topics[0].Partitions[0].ErrorCode; code != kerr.InvalidRequiredAcks.Code {
		t.Fatalf("acks=2: error %d", code)
	}
}

func TestFetchLongPoll(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	f.createTopic(t, "poll", 2)
	rc := dialRaw(t, f.addr)
	fetch := func(maxWait time.Duration) (*kmsg.FetchResponse, time.Duration) {
		req := kmsg.NewPtrFetchRequest()
		req.Version, req.ReplicaID, req.MaxWaitMillis, req.MinBytes, req.MaxBytes = 11, -1, int32(maxWait/time.Millisecond), 1, 1<<20
		req.SessionEpoch = -1
		rt := kmsg.NewFetchRequestTopic()
		rt.Topic = "poll"
		for p := range int32(2) {
			rp := kmsg.NewFetchRequestTopicPartition()
			rp.Partition, rp.FetchOffset, rp.PartitionMaxBytes, rp.CurrentLeaderEpoch = p, 0, 1<<20, -1
			rt.Partitions = append(rt.Partitions, rp)
		}
		req.Topics = append(req.Topics, rt)
		start := time.Now()
		rc.send(req)
		resp := req.ResponseKind().(*kmsg.FetchResponse)
		rc.recv(resp)
		return resp, time.Since(start)
	}

	resp, took := fetch(300 * time.Millisecond)
	if took < 250*time.Millisecond {
		t.Fatalf("empty fetch returned after %v, before MaxWait", took)
	}
	if n := len(resp.Topics[0].Partitions[1].RecordBatches); n != 0 {
		t.Fatalf("empty fetch returned %d bytes", n)
	}

	go func() {
		time.Sleep(200 * time.Millisecond) // deliberate pause: the fetch is parked in its long poll when the record arrives
		batch := broker.EncodeBatch(-1, -1, -1, []broker.Record{{Value: []byte("wake")}})
		if _, err := f.b.Append(context.Background(), "poll", 1, batch); err != nil {
			t.Errorf("append: %v", err)
		}
	}()
	resp, took = fetch(10 * time.Second)
	if took > 5*time.Second {
		t.Fatalf("long poll took %v despite data after 200ms", took)
	}
	p := resp.Topics[0].Partitions[1]
	if p.ErrorCode != 0 || p.HighWatermark != 1 || len(p.RecordBatches) == 0 {
		t.Fatalf("woken fetch: %+v", p)
	}
	var recs []string
	for r, err := range broker.ReadRecords(p.RecordBatches) {
		if err != nil {
			t.Fatal(err)
		}
		recs = append(recs, string(r.Value))
	}
	if len(recs) != 1 || recs[0] != "wake" {
		t.Fatalf("records %q", recs)
	}
}

func TestListOffsetsAndCreateTopics(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	rc := dialRaw(t, f.addr)

	create := kmsg.NewPtrCreateTopicsRequest()
	create.Version, create.TimeoutMillis = 5, 5000
	good := kmsg.NewCreateTopicsRequestTopic()
	good.Topic, good.NumPartitions, good.ReplicationFactor = "created", 3, 1
	retention := "3600000"
	good.Configs = []kmsg.CreateTopicsRequestTopicConfig{{Name: "retention.ms", Value: &retention}}
	badRF := kmsg.NewCreateTopicsRequestTopic()
	badRF.Topic, badRF.NumPartitions, badRF.ReplicationFactor = "replicated", 1, 3
	badName := kmsg.NewCreateTopicsRequestTopic()
	badName.Topic, badName.NumPartitions, badName.ReplicationFactor = "no/slash", 1, -1
	create.Topics = []kmsg.CreateTopicsRequestTopic{good, badRF, badName}
	rc.send(create)
	cresp := create.ResponseKind().(*kmsg.CreateTopicsResponse)
	rc.recv(cresp)
	wantCodes := []int16{0, kerr.InvalidReplicationFactor.Code, kerr.InvalidTopicException.Code}
	for i, tr := range cresp.Topics {
		if tr.ErrorCode != wantCodes[i] {
			t.Errorf("create %s: error %d, want %d", tr.Topic, tr.ErrorCode, wantCodes[i])
		}
	}
	ti, err := f.b.Topic("created")
	if err != nil || len(ti.Partitions) != 3 || ti.Config.RetentionMs != 3600000 {
		t.Fatalf("created topic %+v err %v", ti, err)
	}

	base := time.Now().Add(-time.Hour)
	for i := range 5 {
		batch, err := broker.AppendBatch(nil, broker.BatchOptions{ProducerID: -1}, []broker.Record{{Timestamp: base.Add(time.Duration(i) * time.Minute), Value: []byte("x")}})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.b.Append(context.Background(), "created", 0, batch); err != nil {
			t.Fatal(err)
		}
	}
	list := kmsg.NewPtrListOffsetsRequest()
	list.Version, list.ReplicaID = 4, -1
	lt := kmsg.NewListOffsetsRequestTopic()
	lt.Topic = "created"
	for _, ts := range []int64{-2, -1, base.Add(150 * time.Second).UnixMilli(), base.Add(time.Hour).UnixMilli()} {
		lp := kmsg.NewListOffsetsRequestTopicPartition()
		lp.Partition, lp.Timestamp, lp.CurrentLeaderEpoch = 0, ts, -1
		lt.Partitions = append(lt.Partitions, lp)
	}
	list.Topics = []kmsg.ListOffsetsRequestTopic{lt}
	rc.send(list)
	lresp := list.ResponseKind().(*kmsg.ListOffsetsResponse)
	rc.recv(lresp)
	var got []int64
	for _, p := range lresp.Topics[0].Partitions {
		if p.ErrorCode != 0 {
			t.Fatalf("list offsets: %+v", p)
		}
		got = append(got, p.Offset)
	}
	if want := []int64{0, 5, 3, -1}; !slices.Equal(got, want) {
		t.Fatalf("list offsets = %v, want %v", got, want)
	}
}
