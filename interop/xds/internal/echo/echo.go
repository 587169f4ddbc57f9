// Package echo is the waypost test service (tests/backends/echo.proto) without
// generated code: its two messages are built at run time from a descriptor
// (dynamicpb), so the standard proto codec carries them and no protoc step is
// needed to build these programs.
package echo

import (
	"encoding/json"
	"fmt"
	"os"
	"sync"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/descriptorpb"
	"google.golang.org/protobuf/types/dynamicpb"
)

const (
	// Service is the full name of the Echo service (package waypost.test).
	Service = "waypost.test.Echo"
	// UnaryMethod is the full method name of Echo.Unary.
	UnaryMethod = "/" + Service + "/Unary"
)

var (
	requestDesc protoreflect.MessageDescriptor
	replyDesc   protoreflect.MessageDescriptor
)

func field(name string, number int32, typ descriptorpb.FieldDescriptorProto_Type) *descriptorpb.FieldDescriptorProto {
	return &descriptorpb.FieldDescriptorProto{
		Name:     proto.String(name),
		JsonName: proto.String(name),
		Number:   proto.Int32(number),
		Label:    descriptorpb.FieldDescriptorProto_LABEL_OPTIONAL.Enum(),
		Type:     typ.Enum(),
	}
}

func init() {
	str := descriptorpb.FieldDescriptorProto_TYPE_STRING
	i32 := descriptorpb.FieldDescriptorProto_TYPE_INT32
	fd := &descriptorpb.FileDescriptorProto{
		Name:    proto.String("waypost-interop/echo.proto"),
		Package: proto.String("waypost.test"),
		Syntax:  proto.String("proto3"),
		MessageType: []*descriptorpb.DescriptorProto{
			{Name: proto.String("EchoRequest"), Field: []*descriptorpb.FieldDescriptorProto{
				field("message", 1, str), field("delay_ms", 2, i32), field("error_code", 3, i32),
				field("error_details", 4, str), field("error_after", 5, i32), field("count", 6, i32),
				field("fail_on", 7, str),
			}},
			{Name: proto.String("EchoReply"), Field: []*descriptorpb.FieldDescriptorProto{
				field("message", 1, str), field("server", 2, str), field("index", 3, i32),
				field("previous_attempts", 4, str), field("received", 5, i32),
			}},
		},
	}
	// a private registry: never clashes with anything linked into the program
	file, err := protodesc.NewFile(fd, nil)
	if err != nil {
		panic(fmt.Sprintf("echo descriptor: %v", err))
	}
	requestDesc = file.Messages().ByName("EchoRequest")
	replyDesc = file.Messages().ByName("EchoReply")
}

// NewRequest returns an empty EchoRequest.
func NewRequest() *dynamicpb.Message { return dynamicpb.NewMessage(requestDesc) }

// NewReply returns an empty EchoReply.
func NewReply() *dynamicpb.Message { return dynamicpb.NewMessage(replyDesc) }

// GetString reads a string field by name ("" when unset).
func GetString(m *dynamicpb.Message, name string) string {
	return m.Get(m.Descriptor().Fields().ByName(protoreflect.Name(name))).String()
}

// GetInt reads an int32 field by name (0 when unset).
func GetInt(m *dynamicpb.Message, name string) int32 {
	return int32(m.Get(m.Descriptor().Fields().ByName(protoreflect.Name(name))).Int())
}

// SetString sets a string field by name.
func SetString(m *dynamicpb.Message, name, value string) {
	m.Set(m.Descriptor().Fields().ByName(protoreflect.Name(name)), protoreflect.ValueOfString(value))
}

var emitMu sync.Mutex

// Emit prints one JSON line on stdout (safe from any goroutine).
func Emit(v any) {
	b, err := json.Marshal(v)
	if err != nil {
		b, _ = json.Marshal(map[string]string{"error": err.Error()})
	}
	emitMu.Lock()
	defer emitMu.Unlock()
	os.Stdout.Write(append(b, '\n'))
}

// Fatalf prints {"fatal": "..."} and exits 2.
func Fatalf(format string, args ...any) {
	Emit(map[string]string{"fatal": fmt.Sprintf(format, args...)})
	os.Exit(2)
}

// KV is a repeatable -flag k=v.
type KV []string

func (k *KV) String() string { return fmt.Sprint(*k) }

// Set implements flag.Value.
func (k *KV) Set(s string) error {
	for i := 0; i < len(s); i++ {
		if s[i] == '=' {
			if i == 0 {
				break
			}
			*k = append(*k, s)
			return nil
		}
	}
	return fmt.Errorf("want k=v, got %q", s)
}

// Pairs splits every k=v.
func (k KV) Pairs() [][2]string {
	out := make([][2]string, 0, len(k))
	for _, s := range k {
		for i := 0; i < len(s); i++ {
			if s[i] == '=' {
				out = append(out, [2]string{s[:i], s[i+1:]})
				break
			}
		}
	}
	return out
}
