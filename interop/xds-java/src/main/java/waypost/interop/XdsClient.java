package waypost.interop;

import com.google.common.util.concurrent.ListenableFuture;
import com.google.protobuf.CodedInputStream;
import com.google.protobuf.CodedOutputStream;
import io.grpc.CallOptions;
import io.grpc.Channel;
import io.grpc.ClientInterceptors;
import io.grpc.Grpc;
import io.grpc.InsecureChannelCredentials;
import io.grpc.ManagedChannel;
import io.grpc.Metadata;
import io.grpc.MethodDescriptor;
import io.grpc.Status;
import io.grpc.StatusRuntimeException;
import io.grpc.stub.ClientCalls;
import io.grpc.stub.MetadataUtils;
import java.io.ByteArrayInputStream;
import java.io.IOException;
import java.io.InputStream;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.TimeUnit;

/**
 * grpc-java's xDS client for waypost's interop tests: dials {@code -target xds:///NAME} with the bootstrap in
 * GRPC_XDS_BOOTSTRAP_CONFIG and calls /waypost.test.Echo/Unary in a bounded loop, printing JSON lines exactly
 * like interop/xds's Go xds-client: a progress line every {@code -batch} calls
 * ({"batch": k, "done": n, "t": s, "counts": {...this batch...}, "errors": e}) and at the end
 * {"counts": {...}, "errors": n, "first_error": "...", "calls": n, "seconds": s, "codes": {...}}.
 *
 * <p>Flags: -target, -calls N, -interval D, -deadline D, -batch K, -header k=v (repeatable; {i} in v is the
 * call index, mod -keys K when given, and "by_key" reports which server each value reached), -wait-for-ready,
 * -max-time D, -message S, -parallel N (calls issued N at a time, their starts -interval apart: a wave shares its
 * first call's headers and deadline). Durations: 250ms, 1.5s, 2m. SIGTERM ends the loop early ("interrupted": true).
 *
 * <p>The two messages are hand-encoded (EchoRequest.message = 1, EchoReply.server = 2): no protoc step.
 */
public final class XdsClient {
  private static final String METHOD = "waypost.test.Echo/Unary";

  private static final MethodDescriptor.Marshaller<String> REQUEST = new MethodDescriptor.Marshaller<>() {
    @Override
    public InputStream stream(String message) {
      try {
        byte[] out = new byte[CodedOutputStream.computeStringSize(1, message)];
        CodedOutputStream cos = CodedOutputStream.newInstance(out);
        cos.writeString(1, message);
        cos.checkNoSpaceLeft();
        return new ByteArrayInputStream(out);
      } catch (IOException e) {
        throw new IllegalStateException(e);
      }
    }

    @Override
    public String parse(InputStream stream) {
      throw new UnsupportedOperationException("client only");
    }
  };

  /** Parses an EchoReply and returns its {@code server} field (2). */
  private static final MethodDescriptor.Marshaller<String> REPLY = new MethodDescriptor.Marshaller<>() {
    @Override
    public InputStream stream(String value) {
      throw new UnsupportedOperationException("client only");
    }

    @Override
    public String parse(InputStream stream) {
      try {
        CodedInputStream in = CodedInputStream.newInstance(stream);
        String server = "";
        while (true) {
          int tag = in.readTag();
          if (tag == 0) {
            return server;
          }
          if (tag == ((2 << 3) | 2)) {
            server = in.readString();
          } else if (!in.skipField(tag)) {
            return server;
          }
        }
      } catch (IOException e) {
        throw Status.INTERNAL.withDescription("bad EchoReply: " + e).withCause(e).asRuntimeException();
      }
    }
  };

  private static final MethodDescriptor<String, String> UNARY = MethodDescriptor.<String, String>newBuilder()
      .setType(MethodDescriptor.MethodType.UNARY)
      .setFullMethodName(METHOD)
      .setRequestMarshaller(REQUEST)
      .setResponseMarshaller(REPLY)
      .build();

  private static volatile boolean stopRequested;

  private XdsClient() {}

  static long parseDuration(String s) {
    String t = s.trim();
    double scale;
    if (t.endsWith("ms")) {
      scale = 1;
      t = t.substring(0, t.length() - 2);
    } else if (t.endsWith("s")) {
      scale = 1000;
      t = t.substring(0, t.length() - 1);
    } else if (t.endsWith("m")) {
      scale = 60_000;
      t = t.substring(0, t.length() - 1);
    } else {
      throw new IllegalArgumentException("duration without unit (ms, s, m): " + s);
    }
    return Math.round(Double.parseDouble(t) * scale);
  }

  static String quote(String s) {
    StringBuilder b = new StringBuilder("\"");
    for (int i = 0; i < s.length(); i++) {
      char c = s.charAt(i);
      switch (c) {
        case '"' -> b.append("\\\"");
        case '\\' -> b.append("\\\\");
        case '\n' -> b.append("\\n");
        case '\r' -> b.append("\\r");
        case '\t' -> b.append("\\t");
        default -> {
          if (c < 0x20) {
            b.append(String.format("\\u%04x", (int) c));
          } else {
            b.append(c);
          }
        }
      }
    }
    return b.append('"').toString();
  }

  static String json(Object v) {
    if (v instanceof String s) {
      return quote(s);
    }
    if (v instanceof Map<?, ?> m) {
      StringBuilder b = new StringBuilder("{");
      for (Map.Entry<?, ?> e : m.entrySet()) {
        if (b.length() > 1) {
          b.append(", ");
        }
        b.append(quote(String.valueOf(e.getKey()))).append(": ").append(json(e.getValue()));
      }
      return b.append('}').toString();
    }
    return String.valueOf(v);
  }

  static synchronized void emit(Map<String, Object> line) {
    System.out.println(json(line));
    System.out.flush();
  }

  public static void main(String[] argv) throws Exception {
    String target = "";
    int calls = 100;
    long intervalMs = 0;
    long deadlineMs = 5000;
    int batch = 0;
    int keys = 0;
    int parallel = 1;
    boolean waitForReady = false;
    long maxTimeMs = 600_000;
    String message = "hello";
    List<String[]> headers = new ArrayList<>();
    for (int i = 0; i < argv.length; i++) {
      String a = argv[i];
      if (a.equals("-wait-for-ready")) {
        waitForReady = true;
        continue;
      }
      if (i + 1 >= argv.length) {
        fatal("flag needs a value: " + a);
      }
      String v = argv[++i];
      switch (a) {
        case "-target" -> target = v;
        case "-calls" -> calls = Integer.parseInt(v);
        case "-interval" -> intervalMs = parseDuration(v);
        case "-deadline" -> deadlineMs = parseDuration(v);
        case "-batch" -> batch = Integer.parseInt(v);
        case "-keys" -> keys = Integer.parseInt(v);
        case "-parallel" -> parallel = Integer.parseInt(v);
        case "-max-time" -> maxTimeMs = parseDuration(v);
        case "-message" -> message = v;
        case "-header" -> {
          int eq = v.indexOf('=');
          if (eq <= 0) {
            fatal("-header wants k=v, got " + v);
          }
          headers.add(new String[] {v.substring(0, eq), v.substring(eq + 1)});
        }
        default -> fatal("unknown flag " + a);
      }
    }
    if (target.isEmpty()) {
      fatal("-target is required");
    }
    String boot = System.getenv("GRPC_XDS_BOOTSTRAP_CONFIG");
    if ((boot == null || boot.isEmpty()) && System.getenv("GRPC_XDS_BOOTSTRAP") == null) {
      fatal("no xDS bootstrap: set GRPC_XDS_BOOTSTRAP_CONFIG");
    }

    CountDownLatch finished = new CountDownLatch(1);
    Thread mainThread = Thread.currentThread();
    Runtime.getRuntime().addShutdownHook(new Thread(() -> {
      stopRequested = true;
      mainThread.interrupt();
      try {
        finished.await(5, TimeUnit.SECONDS);
      } catch (InterruptedException ignored) {
        // exiting anyway
      }
    }));

    ManagedChannel channel = Grpc.newChannelBuilder(target, InsecureChannelCredentials.create()).build();
    Map<String, Object> total = new TreeMap<>();
    Map<String, Object> codes = new TreeMap<>();
    Map<String, Object> byKey = new TreeMap<>();
    Map<String, Object> batchCounts = new TreeMap<>();
    int errors = 0;
    int batchErrors = 0;
    String firstError = "";
    String batchFirst = "";
    int done = 0;
    boolean interrupted = false;
    long start = System.nanoTime();
    long stopAt = start + maxTimeMs * 1_000_000L;
    List<ListenableFuture<String>> wave = new ArrayList<>(); // -parallel: calls of this wave not counted yet
    for (int i = 0; i < calls; i++) {
      if (stopRequested || System.nanoTime() > stopAt) {
        interrupted = true;
        break;
      }
      Channel ch = channel;
      String key = "";
      if (!headers.isEmpty()) {
        Metadata md = new Metadata();
        for (String[] h : headers) {
          String value = h[1];
          if (value.contains("{i}")) {
            value = value.replace("{i}", Integer.toString(keys > 0 ? i % keys : i));
            key = value;
          }
          md.put(Metadata.Key.of(h[0], Metadata.ASCII_STRING_MARSHALLER), value);
        }
        ch = ClientInterceptors.intercept(channel, MetadataUtils.newAttachHeadersInterceptor(md));
      }
      CallOptions opts = CallOptions.DEFAULT.withDeadlineAfter(deadlineMs, TimeUnit.MILLISECONDS);
      if (waitForReady) {
        opts = opts.withWaitForReady();
      }
      done++;
      try {
        String server;
        if (parallel > 1) {
          if (wave.isEmpty()) {
            for (int j = 0; j < Math.min(parallel, calls - i); j++) {
              if (j > 0 && intervalMs > 0) {
                Thread.sleep(intervalMs);
              }
              wave.add(ClientCalls.futureUnaryCall(ch.newCall(UNARY, opts), message));
            }
          }
          server = outcome(wave.remove(0));
        } else {
          server = ClientCalls.blockingUnaryCall(ch, UNARY, opts, message);
        }
        total.merge(server, 1, (x, y) -> (Integer) x + (Integer) y);
        batchCounts.merge(server, 1, (x, y) -> (Integer) x + (Integer) y);
        if (keys > 0 && !key.isEmpty()) {
          @SuppressWarnings("unchecked")
          Map<String, Object> m = (Map<String, Object>) byKey.computeIfAbsent(key, k -> new TreeMap<>());
          m.merge(server, 1, (x, y) -> (Integer) x + (Integer) y);
        }
      } catch (InterruptedException e) {
        interrupted = true;
        break;
      } catch (StatusRuntimeException e) {
        if (stopRequested) {
          done--;
          interrupted = true;
          break;
        }
        errors++;
        batchErrors++;
        Status st = e.getStatus();
        codes.merge(st.getCode().name(), 1, (x, y) -> (Integer) x + (Integer) y);
        String msg = st.getCode().name() + ": " + st.getDescription();
        if (firstError.isEmpty()) {
          firstError = msg;
        }
        if (batchFirst.isEmpty()) {
          batchFirst = msg;
        }
      }
      if (batch > 0 && done % batch == 0) {
        Map<String, Object> line = new TreeMap<>();
        line.put("batch", done / batch);
        line.put("done", done);
        line.put("t", (System.nanoTime() - start) / 1e9);
        line.put("counts", batchCounts);
        line.put("errors", batchErrors);
        if (!batchFirst.isEmpty()) {
          line.put("first_error", batchFirst);
        }
        emit(line);
        batchCounts = new TreeMap<>();
        batchErrors = 0;
        batchFirst = "";
      }
      if (intervalMs > 0) {
        try {
          Thread.sleep(intervalMs);
        } catch (InterruptedException e) {
          interrupted = true;
          break;
        }
      }
    }
    Map<String, Object> fin = new TreeMap<>();
    fin.put("counts", total);
    fin.put("errors", errors);
    fin.put("first_error", firstError);
    fin.put("calls", done);
    fin.put("seconds", (System.nanoTime() - start) / 1e9);
    fin.put("codes", codes);
    if (interrupted) {
      fin.put("interrupted", true);
    }
    if (keys > 0) {
      fin.put("by_key", byKey);
    }
    emit(fin);
    channel.shutdownNow();
    finished.countDown();
    if (!stopRequested) {
      System.exit(0);
    }
  }

  /** The server of a call of a wave, or its status as a StatusRuntimeException (as a blocking call throws). */
  private static String outcome(ListenableFuture<String> call) {
    try {
      return call.get();
    } catch (ExecutionException e) {
      throw Status.fromThrowable(e.getCause()).asRuntimeException();
    } catch (InterruptedException e) {
      call.cancel(true);
      throw Status.CANCELLED.withDescription("interrupted").asRuntimeException();
    }
  }

  private static void fatal(String msg) {
    System.out.println("{\"fatal\": " + quote(msg) + "}");
    System.out.flush();
    System.exit(2);
  }
}
