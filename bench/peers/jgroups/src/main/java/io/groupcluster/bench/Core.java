package io.groupcluster.bench;

import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.ByteBuffer;
import java.util.Arrays;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.locks.LockSupport;

/**
 * The JGroups-version-independent part of the benchmark harness: options, the workload, delivery accounting
 * and the result line. Harness (JGroups 5) and Harness212 (JGroups 2.12) adapt it to their channel API.
 *
 * <p>The workload and the result line are the same as groupcluster.bench.workers (the Python side). The
 * process runs rounds on command, so warm-up rounds run in the same JVM as the measured ones: each line
 * {@code round K} on standard input starts round K, in which senders multicast {@code count} messages of
 * {@code size} bytes each (unpaced or at {@code rate} messages per second; a payload starts with the send time
 * in System.nanoTime, CLOCK_MONOTONIC on Linux as Python's time.monotonic, the sender's rank and a sequence
 * number); once this member has delivered every message of rounds 1..K it prints {@code RESULT {json}} with
 * {@code "round": K}, or {@code FAILED K ...} when the round times out. Deliveries are counted cumulatively,
 * so a message of round K that arrives before this member read its own command still counts for round K.
 * Every delivered message is touched: its length is summed and its last byte read (the Python side does the
 * same), so neither side is credited for skipping the payload.
 */
public final class Core {
    /** What the harness needs from a channel of either JGroups version. */
    public interface Sender {
        void multicast(byte[] payload) throws Exception;
    }

    final int rank;
    final int members;
    final int senders;
    final int count;
    final int size;
    final double rate;
    final double timeout;
    final int threads;
    final long expected;
    final CountDownLatch viewComplete = new CountDownLatch(1);
    // Deliveries may come from several threads at once (one per sender in JGroups 5): guarded by this.
    private long delivered; // since the process started, over all rounds
    private long target; // cumulative deliveries at which the current round is complete
    private long roundBase; // cumulative deliveries when the current round's command was read
    private boolean roundDone = true;
    private long touchedBytes;
    private int touchedCheck;
    private long firstNs;
    private long lastNs;
    private long sendStartNs;
    private long sendEndNs;
    private final long[] latencies;
    private int latencyCount;

    private Core(String[] args) {
        int r = 0, m = 4, s = 4, c = 10000, z = 100, th = 1;
        double rt = 0, to = 300;
        for (int i = 0; i + 1 < args.length; i += 2) {
            String v = args[i + 1];
            switch (args[i]) {
                case "--rank" -> r = Integer.parseInt(v);
                case "--members" -> m = Integer.parseInt(v);
                case "--senders" -> s = Integer.parseInt(v);
                case "--count" -> c = Integer.parseInt(v);
                case "--size" -> z = Integer.parseInt(v);
                case "--rate" -> rt = Double.parseDouble(v);
                case "--timeout" -> to = Double.parseDouble(v);
                case "--threads" -> th = Integer.parseInt(v);
                default -> throw new IllegalArgumentException("unknown option " + args[i]);
            }
        }
        rank = r;
        members = m;
        senders = s;
        count = c;
        size = Math.max(z, 16);
        rate = rt;
        timeout = to;
        threads = Math.max(1, th);
        expected = (long) s * c;
        // Latency is sampled only in paced runs, and only after the first tenth of each sender's messages.
        latencies = rate > 0 ? new long[(int) expected] : new long[0];
    }

    public static Core parse(String[] args) {
        return new Core(args);
    }

    public void viewSize(int n) {
        if (n >= members) viewComplete.countDown();
    }

    /** Account one delivered payload; called with the channel's buffer, offset and length. */
    public void deliver(byte[] buf, int off, int len, long nowNs) {
        deliverLocked(buf, off, len, nowNs);
    }

    /** Account a batch of payloads under one lock (the JGroups 5 batch callback). */
    public synchronized void deliverLocked(byte[] buf, int off, int len, long nowNs) {
        delivered++;
        touchedBytes += len;
        if (len > 0) touchedCheck ^= buf[off + len - 1];
        if (roundDone) return;
        if (firstNs == 0) firstNs = nowNs;
        if (latencies.length > 0 && len >= 16) {
            ByteBuffer b = ByteBuffer.wrap(buf, off, len);
            long sent = b.getLong();
            b.getInt();
            int seq = b.getInt();
            if (seq >= count / 10 && latencyCount < latencies.length) latencies[latencyCount++] = nowNs - sent;
        }
        if (delivered >= target) {
            lastNs = nowNs;
            roundDone = true;
            notifyAll();
        }
    }

    private byte[] payload(int seq) {
        byte[] p = new byte[size];
        ByteBuffer b = ByteBuffer.wrap(p);
        b.putLong(System.nanoTime());
        b.putInt(rank);
        b.putInt(seq);
        return p;
    }

    /** Wait for the full view, then run rounds as standard input commands them until it closes. */
    public int run(Sender ch) throws Exception {
        if (!viewComplete.await(60, TimeUnit.SECONDS)) {
            System.err.println("harness: the view never reached " + members + " members");
            return 3;
        }
        System.out.println("READY");
        System.out.flush();
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in));
        String line;
        while ((line = in.readLine()) != null) {
            line = line.trim();
            if (line.equals("exit")) break;
            if (!line.startsWith("round ")) continue;
            int round = Integer.parseInt(line.substring(6).trim());
            if (!runRound(ch, round)) return 4;
        }
        return 0;
    }

    private boolean runRound(Sender ch, int round) throws Exception {
        long deadline = System.nanoTime() + (long) (timeout * 1e9);
        synchronized (this) {
            roundBase = (long) (round - 1) * expected;
            target = (long) round * expected;
            firstNs = 0;
            lastNs = 0;
            sendStartNs = 0;
            sendEndNs = 0;
            latencyCount = 0;
            roundDone = delivered >= target;
            if (roundDone) lastNs = System.nanoTime();
        }
        if (rank < senders) {
            long start = System.nanoTime();
            synchronized (this) {
                sendStartNs = start;
            }
            if (rate > 0 || threads == 1) {
                for (int i = 0; i < count; i++) {
                    if (rate > 0) {
                        // Paced: never ahead of the schedule; park briefly when we are.
                        long due = start + (long) (i * 1e9 / rate);
                        long now;
                        while ((now = System.nanoTime()) < due) LockSupport.parkNanos(Math.min(due - now, 200_000));
                    }
                    ch.multicast(payload(i));
                }
            } else {
                sendFromThreads(ch);
            }
            synchronized (this) {
                sendEndNs = System.nanoTime();
            }
        }
        synchronized (this) {
            while (!roundDone) {
                long left = deadline - System.nanoTime();
                if (left <= 0) {
                    System.out.println("FAILED " + round + " delivered " + (delivered - roundBase) + " of " + expected
                            + " in " + timeout + " s");
                    System.out.flush();
                    return false;
                }
                wait(Math.max(1, left / 1_000_000));
            }
        }
        System.out.println("RESULT " + resultJson(round));
        System.out.flush();
        return true;
    }

    /** Unpaced: the round's messages sent by {@code threads} threads at once (message i by thread i % threads),
     * as JGroups applications and MPerf send; the round's send ends when the last thread is done. */
    private void sendFromThreads(Sender ch) throws Exception {
        Thread[] workers = new Thread[threads];
        Exception[] failed = new Exception[1];
        for (int t = 0; t < threads; t++) {
            final int first = t;
            workers[t] = new Thread(() -> {
                try {
                    for (int i = first; i < count; i += threads) ch.multicast(payload(i));
                } catch (Exception e) {
                    synchronized (failed) {
                        failed[0] = e;
                    }
                }
            }, "sender-" + t);
            workers[t].start();
        }
        for (Thread w : workers) w.join();
        if (failed[0] != null) throw failed[0];
    }

    private synchronized String resultJson(int round) {
        StringBuilder sb = new StringBuilder("{");
        sb.append("\"rank\":").append(rank);
        sb.append(",\"round\":").append(round);
        sb.append(",\"delivered\":").append(expected);
        sb.append(",\"sender_threads\":").append(rate > 0 ? 1 : threads);
        sb.append(",\"touched_bytes\":").append(touchedBytes);
        sb.append(",\"check\":").append(touchedCheck);
        sb.append(",\"first\":").append(firstNs / 1e9);
        sb.append(",\"last\":").append(lastNs / 1e9);
        sb.append(",\"send_start\":").append(sendStartNs == 0 ? "null" : String.valueOf(sendStartNs / 1e9));
        sb.append(",\"send_end\":").append(sendEndNs == 0 ? "null" : String.valueOf(sendEndNs / 1e9));
        if (latencyCount > 0) {
            long[] l = Arrays.copyOf(latencies, latencyCount);
            Arrays.sort(l);
            sb.append(",\"latency_samples\":").append(latencyCount);
            sb.append(",\"p50_us\":").append(l[(int) (0.50 * (latencyCount - 1))] / 1e3);
            sb.append(",\"p99_us\":").append(l[(int) (0.99 * (latencyCount - 1))] / 1e3);
        }
        return sb.append("}").toString();
    }

    /** After the result: stay in the group until the runner kills us. */
    public static void park() {
        while (true) LockSupport.parkNanos(1_000_000_000L);
    }
}
