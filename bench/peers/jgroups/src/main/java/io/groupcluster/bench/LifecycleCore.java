package io.groupcluster.bench;

import java.io.InputStream;
import java.io.OutputStream;
import java.nio.ByteBuffer;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.locks.LockSupport;

/**
 * The JGroups-version-independent part of the join and state-transfer workloads of the peers suite (join-4,
 * join-flush-4, state-transfer-10MB); Lifecycle (JGroups 5) and Lifecycle212 (JGroups 2.12) adapt it:
 *
 * <pre>
 * java -cp ... MAIN CONFIG.xml CLUSTER member --members N [--rate R] [--state-bytes S] [--timeout SECONDS]
 * java -cp ... MAIN CONFIG.xml CLUSTER join --members N [--state-bytes S] [--timeout SECONDS]
 *     [--repeat K] [--launch-wall-ms EPOCH_MS]
 * </pre>
 *
 * <p>A {@code member} joins, prints {@code READY} once its view has {@code --members} members and then
 * {@code VIEW n} at every view change; it multicasts 100-byte messages at {@code --rate} per second (the light
 * load bench/join_latency.py puts on our members) and serves a state of {@code --state-bytes} bytes (the
 * content of bench/state_transfer.py's donors). A {@code join} process is the member being added: its clock
 * starts just before {@code connect} (the JVM's start-up is not measured, as our figure leaves out Python's),
 * {@code join_ms} ends at its first view with {@code --members} members; with {@code --state-bytes} it fetches
 * the state in the same connect call and {@code state_ms} runs from its first view to the last byte read, the
 * clock of bench/state_transfer.py. It prints {@code RESULT {json}}, leaves gracefully and exits. With
 * {@code --launch-wall-ms} (the runner's wall clock when it launched this JVM) the first result also says
 * {@code launch_to_view_ms} (JVM start-up included), and with a state {@code launch_to_state_ms}, from the launch to
 * the last byte of the state read. With {@code --repeat K} the same JVM joins K times (a warm
 * stack: JIT and class loading done): after each result it disconnects and waits for a line {@code next} on
 * standard input (the runner sends it once the members have seen it leave) before it connects again.
 */
public final class LifecycleCore {
    /** What the workloads need from a channel of either JGroups version. */
    public interface Channel {
        void connect(String cluster, boolean withState, long timeoutMs) throws Exception;

        void multicast(byte[] payload) throws Exception;

        void disconnect();

        void close();
    }

    final boolean join;
    final int members;
    final double rate;
    final long stateBytes;
    final long timeoutMs;
    final int repeat;
    final long launchWallMs;
    private final byte[] state;
    private volatile CountDownLatch complete = new CountDownLatch(1);
    private volatile long stackStartNs;
    private volatile long firstViewNs;
    private volatile long fullViewNs;
    private volatile long fullViewWallMs;
    private volatile long stateDoneNs;
    private volatile long stateDoneWallMs;
    private volatile long stateRead = -1;

    private LifecycleCore(String[] args) {
        if (args.length < 1 || !(args[0].equals("member") || args[0].equals("join"))) {
            throw new IllegalArgumentException("the mode must be member or join, not "
                    + (args.length == 0 ? "nothing" : args[0]));
        }
        int m = 4, k = 1;
        double r = 0, t = 120;
        long s = 0, lw = 0;
        for (int i = 1; i < args.length; i += 2) {
            if (i + 1 >= args.length) throw new IllegalArgumentException(args[i] + " needs a value");
            String v = args[i + 1];
            switch (args[i]) {
                case "--members" -> m = Integer.parseInt(v);
                case "--rate" -> r = Double.parseDouble(v);
                case "--state-bytes" -> s = Long.parseLong(v);
                case "--timeout" -> t = Double.parseDouble(v);
                case "--repeat" -> k = Integer.parseInt(v);
                case "--launch-wall-ms" -> lw = Long.parseLong(v);
                default -> throw new IllegalArgumentException("unknown option " + args[i]);
            }
        }
        if (m < 1 || r < 0 || s < 0 || s > Integer.MAX_VALUE || t <= 0 || k < 1) {
            throw new IllegalArgumentException("--members, --rate, --state-bytes or --timeout out of range");
        }
        join = args[0].equals("join");
        members = m;
        rate = r;
        stateBytes = s;
        timeoutMs = (long) (t * 1000);
        repeat = k;
        launchWallMs = lw;
        state = join ? new byte[0] : new byte[(int) s];
        for (int i = 0; i < state.length; i++) state[i] = (byte) i;
    }

    /** The options after CONFIG and CLUSTER; a bad option is an IllegalArgumentException naming it. */
    public static LifecycleCore parse(String[] args) {
        return new LifecycleCore(args);
    }

    /** The channel is about to start its stack (JGroups 5: when connect asks for our address). */
    public void stackStarting() {
        stackStartNs = System.nanoTime();
    }

    public void viewSize(int n) {
        long now = System.nanoTime();
        if (firstViewNs == 0) firstViewNs = now;
        if (n >= members && fullViewNs == 0) {
            fullViewNs = now;
            fullViewWallMs = System.currentTimeMillis();
            complete.countDown();
        }
        if (!join) {
            System.out.println("VIEW " + n);
            System.out.flush();
        }
    }

    /** A donor writes its state in one call: the state protocol cuts it into chunks. */
    public void writeState(OutputStream out) throws Exception {
        out.write(state);
        out.flush();
    }

    public void readState(InputStream in) throws Exception {
        byte[] buf = new byte[1 << 16];
        long total = 0;
        int n;
        while ((n = in.read(buf)) >= 0) total += n;
        stateDoneNs = System.nanoTime();
        stateDoneWallMs = System.currentTimeMillis();
        stateRead = total;
    }

    /** Run the mode; returns the exit status (a member never returns unless it fails). */
    public int run(String cluster, Channel ch) throws Exception {
        if (join) {
            java.io.BufferedReader in = new java.io.BufferedReader(new java.io.InputStreamReader(System.in));
            for (int i = 1; i <= repeat; i++) {
                if (i > 1) {
                    String line = in.readLine();
                    if (line == null || !line.trim().equals("next")) break;
                }
                int code = joinOnce(cluster, ch, i);
                if (code != 0) return code;
                if (i < repeat) ch.disconnect();
            }
            ch.close(); // a graceful leave, as bench/join_latency.py terminates its joiners gracefully
            return 0;
        }
        ch.connect(cluster, false, timeoutMs);
        if (!complete.await(timeoutMs, TimeUnit.MILLISECONDS)) {
            System.err.println("lifecycle: the view never reached " + members + " members");
            return 3;
        }
        System.out.println("READY");
        System.out.flush();
        if (rate <= 0) Core.park();
        long start = System.nanoTime();
        for (long i = 0; ; i++) {
            long due = start + (long) (i * 1e9 / rate);
            long now;
            while ((now = System.nanoTime()) < due) LockSupport.parkNanos(Math.min(due - now, 1_000_000));
            byte[] p = new byte[100];
            ByteBuffer.wrap(p).putLong(System.nanoTime()).putLong(i);
            ch.multicast(p);
        }
    }

    private int joinOnce(String cluster, Channel ch, int iteration) throws Exception {
        complete = new CountDownLatch(1);
        firstViewNs = 0;
        fullViewNs = 0;
        stateDoneNs = 0;
        stateRead = -1;
        long t0 = System.nanoTime();
        ch.connect(cluster, stateBytes > 0, timeoutMs);
        if (!complete.await(timeoutMs, TimeUnit.MILLISECONDS)) {
            System.err.println("lifecycle: the view never reached " + members + " members");
            return 3;
        }
        StringBuilder sb = new StringBuilder("RESULT {");
        sb.append("\"iteration\":").append(iteration);
        sb.append(",\"join_ms\":").append((fullViewNs - t0) / 1e6);
        if (iteration == 1 && launchWallMs > 0) sb.append(",\"launch_to_view_ms\":").append(fullViewWallMs - launchWallMs);
        sb.append(",\"connect_to_first_view_ms\":").append((firstViewNs - t0) / 1e6);
        if (stackStartNs >= t0) sb.append(",\"stack_start_ms\":").append((stackStartNs - t0) / 1e6);
        if (stateBytes > 0) {
            if (stateRead != stateBytes) {
                System.err.println("lifecycle: got a state of " + stateRead + " bytes, expected " + stateBytes);
                return 4;
            }
            sb.append(",\"state_bytes\":").append(stateRead);
            sb.append(",\"state_ms\":").append((stateDoneNs - firstViewNs) / 1e6);
            sb.append(",\"join_and_state_ms\":").append((stateDoneNs - t0) / 1e6);
            if (iteration == 1 && launchWallMs > 0) {
                sb.append(",\"launch_to_state_ms\":").append(stateDoneWallMs - launchWallMs);
            }
        }
        System.out.println(sb.append("}"));
        System.out.flush();
        return 0;
    }
}
