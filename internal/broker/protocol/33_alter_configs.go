package protocol

import (
	"errors"
	"fmt"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/outboxrelay/relay/internal/broker"
)

// configChange is one config of an alter request: set to value, or back
// to the broker's default (del).
type configChange struct {
	name, value string
	del         bool
}

// alterTopic applies changes to the topic's config (from the broker's
// defaults instead when replace, as the legacy AlterConfigs replaces
// every dynamic config), or only checks them when validateOnly. A
// refused change alters nothing.
func (s *Server) alterTopic(name string, changes []configChange, replace, validateOnly bool) (int16, error) {
	ti, err := s.b.Topic(name)
	if err != nil {
		return broker.KafkaErrorCode(err), err
	}
	defaults := s.b.DefaultTopicConfig()
	cfg := ti.Config
	if replace {
		cfg = defaults
		cfg.Partitions = ti.Config.Partitions
	}
	seen := map[string]bool{}
	for _, c := range changes {
		if seen[c.name] {
			return kerr.InvalidRequest.Code, fmt.Errorf("config %s named more than once", c.name)
		}
		seen[c.name] = true
		f, ok := broker.FindTopicConfig(c.name)
		if !ok {
			return kerr.InvalidConfig.Code, fmt.Errorf("config %s is not supported", c.name)
		}
		v := c.value
		if c.del {
			v = f.Get(defaults)
		}
		if err := f.Set(&cfg, v); err != nil {
			return kerr.InvalidConfig.Code, err
		}
	}
	if validateOnly {
		if err := s.b.ValidateTopicConfig(cfg); err != nil {
			return broker.KafkaErrorCode(err), err
		}
		return 0, nil
	}
	after, err := s.b.AlterTopicConfig(name, cfg)
	if err != nil {
		return broker.KafkaErrorCode(err), err
	}
	s.log.Info("altered topic configs", "topic", name, "configs", len(changes), "retention_ms", after.Config.RetentionMs,
		"retention_bytes", after.Config.RetentionBytes, "cleanup_policy", after.Config.CleanupPolicy)
	return 0, nil
}

var errBrokerConfigs = errors.New("the embedded broker's settings are the relay's flags; they cannot be altered through Kafka")

// alterOutcome is the error code and message of altering one resource:
// topic alters a topic; brokers and other resources are refused.
func alterOutcome(rt kmsg.ConfigResourceType, topic func() (int16, error)) (int16, *string) {
	var code int16
	var err error
	switch rt {
	case kmsg.ConfigResourceTypeTopic:
		code, err = topic()
	case kmsg.ConfigResourceTypeBroker:
		code, err = kerr.InvalidRequest.Code, errBrokerConfigs
	default:
		code, err = kerr.InvalidRequest.Code, fmt.Errorf("resource type %d cannot be altered", rt)
	}
	if err == nil {
		return code, nil
	}
	msg := err.Error()
	return code, &msg
}

// handleAlterConfigs replaces topics' configs: those not named go back to
// the broker's defaults, as in Kafka.
func (s *Server) handleAlterConfigs(req *kmsg.AlterConfigsRequest, resp *kmsg.AlterConfigsResponse) {
	for _, rr := range req.Resources {
		r := kmsg.NewAlterConfigsResponseResource()
		r.ResourceType, r.ResourceName = rr.ResourceType, rr.ResourceName
		if rr.ResourceType == kmsg.ConfigResourceTypeGroupConfig {
			names, values, dels := make([]string, 0, len(rr.Configs)), make([]string, 0, len(rr.Configs)), make([]bool, 0, len(rr.Configs))
			for _, c := range rr.Configs {
				names, values, dels = append(names, c.Name), append(values, strOrEmpty(c.Value)), append(dels, c.Value == nil)
			}
			r.ErrorCode, r.ErrorMessage = errOutcome(s.share.alterConfigs(rr.ResourceName, names, values, dels, false, req.ValidateOnly))
			resp.Resources = append(resp.Resources, r)
			continue
		}
		r.ErrorCode, r.ErrorMessage = alterOutcome(rr.ResourceType, func() (int16, error) {
			changes := make([]configChange, 0, len(rr.Configs))
			for _, c := range rr.Configs {
				ch := configChange{name: c.Name, del: c.Value == nil}
				if c.Value != nil {
					ch.value = *c.Value
				}
				changes = append(changes, ch)
			}
			return s.alterTopic(rr.ResourceName, changes, true, req.ValidateOnly)
		})
		resp.Resources = append(resp.Resources, r)
	}
}

// handleIncrementalAlterConfigs sets or deletes (back to the default) the
// named configs of topics and keeps the rest. APPEND and SUBTRACT apply
// to list configs only; cleanup.policy is the one list (delete, compact or
// both), and SUBTRACT may not leave it empty.
func (s *Server) handleIncrementalAlterConfigs(req *kmsg.IncrementalAlterConfigsRequest, resp *kmsg.IncrementalAlterConfigsResponse) {
	for _, rr := range req.Resources {
		r := kmsg.NewIncrementalAlterConfigsResponseResource()
		r.ResourceType, r.ResourceName = rr.ResourceType, rr.ResourceName
		if rr.ResourceType == kmsg.ConfigResourceTypeGroupConfig {
			r.ErrorCode, r.ErrorMessage = errOutcome(s.incrementalGroup(rr, req.ValidateOnly))
			resp.Resources = append(resp.Resources, r)
			continue
		}
		r.ErrorCode, r.ErrorMessage = alterOutcome(rr.ResourceType, func() (int16, error) {
			return s.incrementalTopic(rr, req.ValidateOnly)
		})
		resp.Resources = append(resp.Resources, r)
	}
}

func (s *Server) incrementalTopic(rr kmsg.IncrementalAlterConfigsRequestResource, validateOnly bool) (int16, error) {
	ti, err := s.b.Topic(rr.ResourceName)
	if err != nil {
		return broker.KafkaErrorCode(err), err
	}
	changes := make([]configChange, 0, len(rr.Configs))
	for _, c := range rr.Configs {
		ch := configChange{name: c.Name}
		if c.Value != nil {
			ch.value = *c.Value
		}
		switch c.Op {
		case kmsg.IncrementalAlterConfigOpSet:
		case kmsg.IncrementalAlterConfigOpDelete:
			ch.del = true
		case kmsg.IncrementalAlterConfigOpAppend, kmsg.IncrementalAlterConfigOpSubtract:
			if c.Name != "cleanup.policy" {
				return kerr.InvalidConfig.Code, fmt.Errorf("config %s is not a list: APPEND and SUBTRACT apply to lists", c.Name)
			}
			v, err := listOp(ti.Config.CleanupPolicy, ch.value, c.Op == kmsg.IncrementalAlterConfigOpAppend)
			if err != nil {
				return kerr.InvalidConfig.Code, err
			}
			ch.value = v
		default:
			return kerr.InvalidRequest.Code, fmt.Errorf("config %s: unknown operation %d", c.Name, c.Op)
		}
		changes = append(changes, ch)
	}
	return s.alterTopic(rr.ResourceName, changes, false, validateOnly)
}

// listOp appends the policies of value to current, or subtracts them.
func listOp(current broker.CleanupPolicy, value string, add bool) (string, error) {
	change, err := broker.ParseCleanupPolicy(value)
	if err != nil {
		return "", err
	}
	del := current.Deletes()
	compact := current.Compacts()
	if add {
		del, compact = del || change.Deletes(), compact || change.Compacts()
	} else {
		del, compact = del && !change.Deletes(), compact && !change.Compacts()
	}
	switch {
	case del && compact:
		return string(broker.CleanupDeleteCompact), nil
	case del:
		return string(broker.CleanupDelete), nil
	case compact:
		return string(broker.CleanupCompact), nil
	}
	return "", fmt.Errorf("cleanup.policy %s minus %s leaves no policy", current, value)
}
