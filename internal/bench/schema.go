package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/hamba/avro/v2"

	"github.com/outboxrelay/relay/internal/registry"
)

// SchemaBench is a backlog drained with and without schema validation,
// per format, in one run: the same payloads each time, one topic per
// format, four drains per format in the order off, on, on, off, so that a
// drift of the machine's load during the run weighs on both sides; each
// rate is the mean of its two drains.
type SchemaBench struct {
	Formats []SchemaFormat `json:"formats"`
}

// SchemaFormat is one format's pair of drains.
type SchemaFormat struct {
	Format string `json:"format"`
	// PayloadBytes is the size of each event's payload.
	PayloadBytes int     `json:"payload_bytes"`
	OffRate      float64 `json:"off_events_per_second"`
	OnRate       float64 `json:"on_events_per_second"`
	// Ratio is OnRate / OffRate.
	Ratio float64 `json:"on_to_off"`
	// OffCPU and OnCPU are the relay's CPU time per event, in
	// microseconds.
	OffCPU float64 `json:"off_relay_cpu_us_per_event"`
	OnCPU  float64 `json:"on_relay_cpu_us_per_event"`
}

const (
	benchJSONSchema = `{"$schema":"http://json-schema.org/draft-07/schema#","type":"object","additionalProperties":false,
"properties":{"id":{"type":"string"},"key":{"type":"string"},"qty":{"type":"integer","minimum":0},"state":{"enum":["new","paid","shipped"]},"note":{"type":"string"}},
"required":["id","key","qty","state"]}`
	benchAvroSchema = `{"type":"record","name":"BenchEvent","namespace":"relay.bench","fields":[{"name":"id","type":"string"},{"name":"key","type":"string"},
{"name":"qty","type":"int"},{"name":"state","type":{"type":"enum","name":"State","symbols":["new","paid","shipped"]}},{"name":"note","type":"string"}]}`
)

// benchPayloads returns the JSON and Avro payloads of one event, with a
// note that pads the JSON one to about payloadBytes.
func benchPayloads(payloadBytes int) (jsonPayload, avroPayload []byte, err error) {
	v := map[string]any{"id": "evt-0000000123", "key": "key-123", "qty": 17, "state": "paid"}
	bare, _ := json.Marshal(v)
	v["note"] = strings.Repeat("x", max(payloadBytes-len(bare)-10, 1))
	if jsonPayload, err = json.Marshal(v); err != nil {
		return nil, nil, err
	}
	avroPayload, err = avro.Marshal(avro.MustParse(benchAvroSchema), v)
	return jsonPayload, avroPayload, err
}

// schemaBacklog measures the drain with validation off and on, for JSON
// Schema and Avro; on means a contract on the topic and the Confluent
// wire format.
func (e *env) schemaBacklog(ctx context.Context) (Result, error) {
	res := e.result("backlog+schema")
	store, err := registry.NewStore(e.pool, "outbox")
	if err != nil {
		return res, err
	}
	jsonPayload, avroPayload, err := benchPayloads(e.cfg.PayloadBytes)
	if err != nil {
		return res, err
	}
	formats := []struct {
		name, topic, typ, schema string
		payload                  []byte
	}{
		{"json", "bench-json", registry.TypeJSON, benchJSONSchema, jsonPayload},
		{"avro", "bench-avro", registry.TypeAvro, benchAvroSchema, avroPayload},
	}
	sb := &SchemaBench{}
	start := time.Now()
	for _, f := range formats {
		if _, err := store.Register(ctx, registry.SubjectOf(f.topic), f.typ, f.schema); err != nil {
			return res, fmt.Errorf("registering the bench schema: %w", err)
		}
		on := []string{"--schema-topics", f.topic, "--schema-wire-format"}
		sf := SchemaFormat{Format: f.name, PayloadBytes: len(f.payload)}
		for _, validate := range []bool{false, true, true, false} {
			var extra []string
			if validate {
				extra = on
			}
			e.cfg.Logger.Info("draining a backlog", "format", f.name, "validation", validate)
			rate, cpu, n, err := e.drainPayload(ctx, f.topic, f.payload, extra)
			res.Published += n
			res.Written += n
			if err != nil || ctx.Err() != nil {
				res.Interrupted = ctx.Err() != nil
				return res, err
			}
			if validate {
				sf.OnRate += rate / 2
				sf.OnCPU += cpu / 2
			} else {
				sf.OffRate += rate / 2
				sf.OffCPU += cpu / 2
			}
		}
		sf.Ratio = sf.OnRate / sf.OffRate
		sb.Formats = append(sb.Formats, sf)
	}
	res.Events = res.Written
	res.Elapsed = time.Since(start)
	res.Schema = sb
	return res, nil
}

// drainPayload writes Events events of payload to topic, then times the
// relay (with extra flags) draining them. Any dead letter is an error:
// the rate would count events that were not published.
func (e *env) drainPayload(ctx context.Context, topic string, payload []byte, extra []string) (rate, cpuPerEvent float64, published int, err error) {
	if err := e.settle(ctx); err != nil {
		return 0, 0, 0, err
	}
	insert := `INSERT INTO outbox.events (topic, key, payload)
SELECT $4, 'key-' || ((g + $3) % $2), $5::bytea FROM generate_series(1, $1) AS g`
	written, _, err := e.fillWith(ctx, e.cfg.Events, 0, insert, nil, topic, payload)
	if err != nil || ctx.Err() != nil {
		return 0, 0, 0, err
	}
	before, err := e.published(ctx)
	if err != nil {
		return 0, 0, 0, err
	}
	p, err := e.startRelayWith(ctx, extra...)
	if err != nil {
		return 0, 0, 0, err
	}
	n, err := e.waitPublished(ctx, before+written)
	elapsed := time.Since(p.started)
	_, cpu := p.usage()
	p.stop()
	n -= before
	if err != nil {
		return 0, 0, n, err
	}
	var dead int
	if err := e.pool.QueryRow(ctx, "SELECT count(*) FROM outbox.dead_letters").Scan(&dead); err != nil {
		return 0, 0, n, err
	}
	if dead > 0 {
		return 0, 0, n, fmt.Errorf("%d bench events went to the dead letters (relay flags %v)", dead, extra)
	}
	return float64(n) / elapsed.Seconds(), cpu / float64(n) * 1e6, n, nil
}
